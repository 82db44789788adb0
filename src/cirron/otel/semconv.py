"""Every span, attribute and event name cirron writes: one vocabulary, and the one place that
maps it to OpenTelemetry's semantic conventions where one exists.

The hooks, the core, the read-back, the report and the ``cirron`` command all name spans
and attributes from here (``tests/test_semconv.py`` fails on a name written as a literal
anywhere else), so a Keras, Lightning or HF run is read with the same names as a torch run.
``shared/spec/otel-mapping.md`` is the contract these names keep.

Where OpenTelemetry has a convention, it is used as is: the ``exception`` event and its
``exception.*`` attributes (:meth:`cirron.otel.spans.ScopeSpan.record_exception`),
``service.name``, ``service.instance.id``, ``host.name`` and ``process.pid`` on the
resource; ``error.type`` and ``code.function.name``; and an LLM call's ``gen_ai.*`` names,
OpenTelemetry's GenAI conventions (``opentelemetry-semantic-conventions``' own constants). The training vocabulary has no OpenTelemetry convention yet: its names are
cirron's own, and cirron's resource attributes are namespaced ``cirron.*``.
"""

from __future__ import annotations

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GenAiOperationNameValues as GenAiOperationNameValues,
)
from opentelemetry.semconv.attributes import code_attributes, error_attributes
from opentelemetry.semconv.resource import ResourceAttributes

# -- spans ----------------------------------------------------------------------------------
SESSION = "cirron.session"  # the root of a profiled process
TRAIN = "train"  # one run of a framework's loop (fit(), train())
EPOCH = "epoch"
STEP = "step"  # the work up to an optimizer moment
BATCH = "batch"  # a ci.batches item, a Keras batch
FORWARD = "forward"  # the outermost module call
BACKWARD = "backward"
OPTIMIZER_STEP = "optimizer_step"
DATA_LOAD = "data_load"  # a batch fetch
VALIDATE = "validate"  # evaluation during training, inside its epoch
EVALUATE = "evaluate"  # evaluation on its own
TEST = "test"
PREDICT = "predict"
CHECKPOINT = "checkpoint"
SNAPSHOT = "snapshot"
INFERENCE = "inference"  # a call of a function ci.inference traces (unless named otherwise)
# A torch.distributed collective: a DDP gradient bucket's all-reduce (a child of its
# backward), or a call of the program's (dist.all_reduce, broadcast, barrier, ...).
COLLECTIVE = "collective"

PASSES = (VALIDATE, EVALUATE, TEST, PREDICT)  # evaluation and prediction passes
STEP_PARTS = (DATA_LOAD, FORWARD, BACKWARD, OPTIMIZER_STEP)  # what a step's time is made of

# -- span attributes ------------------------------------------------------------------------
INDEX = "index"  # of an epoch, step or batch; a validate pass's is its epoch's
BATCHES = "batches"  # batches of an evaluation or prediction pass
DETAIL = "detail"  # false: a step step_sampling kept without its hook spans
PARTIAL = "partial"  # a step that ended before its optimizer moment
SKIPPED = "skipped"  # a step (and its optimizer_step) a GradScaler skipped
LOSS_SCALE = "loss_scale"  # the GradScaler's scale at a skipped step
DATA_LOAD_NS = "data_load_ns"  # a ci.batches batch's wait for its DataLoader
MODE = "mode"  # of a forward
MODE_TRAIN = "train"  # train mode with gradients
MODE_EVAL = "eval"  # eval mode, or no gradients
MODULE = "module"  # the class of the user's model
WRAPPER = "wrapper"  # the class of what wraps it (DDP, torch.compile, FSDP, Fabric)
RECOMPUTE = "recompute"  # a forward activation checkpointing recomputes in a backward
OPTIMIZER = "optimizer"  # the optimizer's class
GPU_NS = "gpu_ns"  # device time of a call on CUDA

# What a step cost the machine (cirron.training.resources).
CPU_NS = "cpu_ns"  # CPU time of the training thread during the step
# Time the training thread was ready to run but waited for a CPU another thread or process
# held (Linux: the run delay in /proc/thread-self/schedstat); sleeping and I/O are not in it.
CPU_WAIT_NS = "cpu_wait_ns"
# The process's resident memory at the step's end, in bytes: OpenTelemetry's metric name.
PROCESS_MEMORY_USAGE = "process.memory.usage"
# The CUDA caching allocator's peaks during the step, in bytes (torch: max_memory_allocated
# and max_memory_reserved, reset at each step's end).
CUDA_MEMORY_PEAK_ALLOCATED = "cuda.memory.peak_allocated"
CUDA_MEMORY_PEAK_RESERVED = "cuda.memory.peak_reserved"

PATH = "path"  # of a checkpoint
SANITY_CHECK = "sanity_check"  # Lightning's validation before training
METRIC_KEY_PREFIX = "metric_key_prefix"  # an HF evaluation's
ESTIMATOR = "estimator"  # the class behind a ci.wrap span
PARENT_SPAN_ID = "cirron.parent_span_id"  # the parent of an epoch that begins its own trace
MARK_PREFIX = "mark."  # a summary mark: mark.<name>

# A run's `train` span: what its framework knows of it.
EPOCHS = "epochs"
STEPS = "steps"
MAX_EPOCHS = "max_epochs"
MAX_STEPS = "max_steps"
NUM_TRAIN_EPOCHS = "num_train_epochs"
GRADIENT_ACCUMULATION_STEPS = "gradient_accumulation_steps"
ACCUMULATE_GRAD_BATCHES = "accumulate_grad_batches"

# cirron.session
FRAMEWORK = "framework"
DEVICE = "device"
CUDA_COUNT = "cuda_count"
MIXED_PRECISION = "mixed_precision"

# collective spans (cirron.instrumentors.torch_collectives)
COLLECTIVE_OP = "collective.op"  # all_reduce, broadcast, all_gather, reduce_scatter, barrier, ...
COLLECTIVE_BYTES = "collective.bytes"  # what this rank sends: a DDP bucket, or its tensors
COLLECTIVE_BUCKET = "collective.bucket"  # a DDP gradient bucket's index
COLLECTIVE_GROUP_SIZE = "collective.group_size"  # the ranks in the process group
COLLECTIVE_BACKEND = "collective.backend"  # the process group's backend: gloo, nccl, ...

# snapshot spans
SNAPSHOT_MODE = "snapshot.mode"
SNAPSHOT_MODEL = "snapshot.model"
SNAPSHOT_TENSORS = "snapshot.tensors"
SNAPSHOT_SKIPPED = "snapshot.skipped"
SNAPSHOT_WEIGHTS_PATH = "snapshot.weights_path"
SNAPSHOT_GRADIENTS_PATH = "snapshot.gradients_path"

# An inference span (ci.inference); an LLM call's too, where they apply.
BATCH_SIZE = "batch.size"  # inputs in the call: its first argument's first dimension, or length
MODEL_NAME = "model.name"  # what the model was loaded from, else its class
INPUT_SHAPE = "input.shape"  # with capture of tensors: the shape of what the call was given
OUTPUT_SHAPE = "output.shape"  # with capture of tensors: the shape of what it returned
TOKENS_PER_SECOND = "tokens_per_second"  # an LLM call's output tokens over its duration
CODE_FUNCTION_NAME = code_attributes.CODE_FUNCTION_NAME  # the traced function's qualified name
ERROR_TYPE = error_attributes.ERROR_TYPE  # the class of the exception a call raised

# An LLM call: OpenTelemetry's GenAI conventions. Its span is named "{operation} {model}".
GEN_AI_OPERATION_NAME = gen_ai.GEN_AI_OPERATION_NAME  # text_completion, or chat
GEN_AI_PROVIDER_NAME = gen_ai.GEN_AI_PROVIDER_NAME  # huggingface: a model run in this process
GEN_AI_REQUEST_MODEL = gen_ai.GEN_AI_REQUEST_MODEL  # what the model was loaded from, else its class
GEN_AI_REQUEST_MAX_TOKENS = gen_ai.GEN_AI_REQUEST_MAX_TOKENS  # the new tokens it may make
GEN_AI_REQUEST_TEMPERATURE = gen_ai.GEN_AI_REQUEST_TEMPERATURE  # when sampling
GEN_AI_REQUEST_TOP_P = gen_ai.GEN_AI_REQUEST_TOP_P  # when sampling
GEN_AI_REQUEST_TOP_K = gen_ai.GEN_AI_REQUEST_TOP_K  # when sampling
GEN_AI_REQUEST_CHOICE_COUNT = gen_ai.GEN_AI_REQUEST_CHOICE_COUNT  # sequences per prompt, if > 1
GEN_AI_REQUEST_STOP_SEQUENCES = gen_ai.GEN_AI_REQUEST_STOP_SEQUENCES  # its stop strings
GEN_AI_REQUEST_STREAM = gen_ai.GEN_AI_REQUEST_STREAM  # true: a streamer was given
GEN_AI_USAGE_INPUT_TOKENS = gen_ai.GEN_AI_USAGE_INPUT_TOKENS  # the prompts' tokens, no padding
GEN_AI_USAGE_OUTPUT_TOKENS = gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS  # new tokens, to end-of-text
GEN_AI_RESPONSE_FINISH_REASONS = gen_ai.GEN_AI_RESPONSE_FINISH_REASONS  # stop or length, each
# Seconds from the call's start to its first new token (a streamer's), or a stream's first item.
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK
# With capture of text: the prompts and the completions, as the conventions' JSON messages.
GEN_AI_INPUT_MESSAGES = gen_ai.GEN_AI_INPUT_MESSAGES
GEN_AI_OUTPUT_MESSAGES = gen_ai.GEN_AI_OUTPUT_MESSAGES

# -- events ---------------------------------------------------------------------------------
MARK_VALUE = "value"  # the attribute of a point mark's event (the event is named after the mark)
EXCEPTION = "exception"  # OpenTelemetry's exception event, and its attributes
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"
EXCEPTION_STACKTRACE = "exception.stacktrace"
EXCEPTION_ESCAPED = "exception.escaped"
NON_FINITE_GRAD_RETRY = "non_finite_grad_retry"  # a trainloop step retried
RETRIES = "retries"
NON_FINITE_GRAD_RETRIES = "non_finite_grad_retries"
# OpenTelemetry GenAI's event for captured messages (capture where="event"): its attributes are
# gen_ai.input.messages and gen_ai.output.messages. Not in opentelemetry-semantic-conventions yet.
GEN_AI_OPERATION_DETAILS = "gen_ai.client.inference.operation.details"

# A snapshot's event per tensor (named after the tensor).
TENSOR_KIND = "kind"
KIND_WEIGHT = "weight"
KIND_GRADIENT = "gradient"
DTYPE = "dtype"
SHAPE = "shape"
MEAN = "mean"
STD = "std"
MIN = "min"
MAX = "max"
NORM = "norm"
HISTOGRAM = "histogram"
HISTOGRAM_RANGE = "histogram_range"
NAN_COUNT = "nan_count"
INF_COUNT = "inf_count"
TRAINABLE = "trainable"  # a weight the optimizer updates (Keras: false for moving statistics)

# -- metrics ---------------------------------------------------------------------------------
# Instruments cirron records (cirron.metrics). A point mark is an instrument named after the mark.
STEP_DURATION = "cirron.step.duration"  # histogram, s: a step's wall time
STEP_TIME = "cirron.step.time"  # counter, s: the steps' time in each part, by cirron.step.part
STEP_PART = "cirron.step.part"  # data_load, forward, backward, optimizer_step or other
STEP_COUNT = "cirron.steps"  # counter of the steps that ended
EPOCH_COUNT = "cirron.epochs"  # counter of the epochs that ended
STEP_CPU_TIME = "cirron.step.cpu.time"  # histogram, s: the training thread's CPU time in a step
STEP_MEMORY_USAGE = "cirron.step.memory.usage"  # histogram, By: the RSS at each step's end
STEP_CUDA_MEMORY_PEAK_ALLOCATED = "cirron.step.cuda.memory.peak_allocated"  # histogram, By
STEP_CUDA_MEMORY_PEAK_RESERVED = "cirron.step.cuda.memory.peak_reserved"  # histogram, By

# System metrics, sampled by one thread: OpenTelemetry's process and hardware conventions.
PROCESS_CPU_TIME = "process.cpu.time"  # counter, s, by cpu.mode
PROCESS_CPU_UTILIZATION = "process.cpu.utilization"  # gauge, 1: CPU time over wall time and CPUs
CPU_MODE = "cpu.mode"  # the attribute process.cpu.time is split by
CPU_MODES = ("user", "system")  # its values, as OpenTelemetry names them
HW_GPU_UTILIZATION = "hw.gpu.utilization"  # gauge, 1: the share of time the GPU was busy
HW_GPU_MEMORY_USAGE = "hw.gpu.memory.usage"  # up-down counter, By: device memory in use
HW_GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"  # up-down counter, By: the device's memory
HW_ID = "hw.id"  # a GPU's UUID
HW_NAME = "hw.name"  # a GPU's product name
HW_VENDOR = "hw.vendor"

# -- the resource ---------------------------------------------------------------------------
SERVICE_NAME = ResourceAttributes.SERVICE_NAME
SERVICE_INSTANCE_ID = ResourceAttributes.SERVICE_INSTANCE_ID
HOST_NAME = ResourceAttributes.HOST_NAME
PROCESS_PID = ResourceAttributes.PROCESS_PID
RANK = "cirron.rank"
LOCAL_RANK = "cirron.local_rank"
WORLD_SIZE = "cirron.world_size"
RUN_ID = "cirron.run_id"
PIPELINE_ID = "cirron.pipeline_id"
DEPLOYMENT_ID = "cirron.deployment_id"
WORKSPACE_ID = "cirron.workspace_id"
