"""Every span, attribute and event name cirron writes: one vocabulary, and the one place that
maps it to OpenTelemetry's semantic conventions where one exists.

The hooks, the core, the read-back, the report and the ``cirron`` command all name spans
and attributes from here (``tests/test_semconv.py`` fails on a name written as a literal
anywhere else), so a Keras, Lightning or HF run is read with the same names as a torch run.
``shared/spec/otel-mapping.md`` is the contract these names keep.

Where OpenTelemetry has a convention, it is used as is: the ``exception`` event and its
``exception.*`` attributes (:meth:`cirron.otel.spans.ScopeSpan.record_exception`),
``service.name``, ``service.instance.id``, ``host.name`` and ``process.pid`` on the
resource. The training vocabulary has no OpenTelemetry convention yet: its names are
cirron's own, and cirron's resource attributes are namespaced ``cirron.*``.
"""

from __future__ import annotations

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

# snapshot spans
SNAPSHOT_MODE = "snapshot.mode"
SNAPSHOT_MODEL = "snapshot.model"
SNAPSHOT_TENSORS = "snapshot.tensors"
SNAPSHOT_SKIPPED = "snapshot.skipped"
SNAPSHOT_WEIGHTS_PATH = "snapshot.weights_path"
SNAPSHOT_GRADIENTS_PATH = "snapshot.gradients_path"

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
