/* The compiled twins of cirron's hottest entries: torch's ``nn.Module.__call__``; the begin
 * and end of a hook span (the span a hook puts around a forward, a backward or an optimizer
 * step); ci.mark and ci.scope, scopes.open_on/close_span (a step's, an epoch's, a batch's
 * span), the span processor's on_start/on_end, and the spool encoder's spans, attributes
 * and marks, each on its common path.
 *
 * The pure-Python implementations (cirron.instrumentors.torch_modules.make_module_call,
 * cirron.recording.hook_spans.begin/end, cirron.instrumentors.torch_spans.open_hook, the
 * PURE_TWINS of cirron.recording.scopes, PURE_MARK of cirron.recording.marks) are the
 * reference; this file does the same, on the common path only. cirron.recording.hot picks
 * it, or the pure twins when it is missing or CIRRON_PURE_PYTHON=1.
 *
 * A submodule call (inside an outermost forward) goes straight to torch's own
 * ``_call_impl`` (or a compiled module's ``_compiled_call_impl``) with no Python frame of
 * ours: cheaper than torch's own ``_wrapped_call_impl``, a Python function. The outermost
 * call sets the process-wide "inside a forward" flag and hands the call to the Python
 * function that decides what the call means (``outermost(original, module, args,
 * kwargs)``), so that logic stays in Python, where it can be read. The outermost call of a
 * loss module (``plain``), which is no forward of the model, runs as a submodule's does,
 * with the flag set: what _forward_call does with it, without its frame.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>  /* offsetof */
#include <structmember.h>  /* PyMemberDef, T_OBJECT */

/* An outermost module call is running (any thread), as torch_modules._inside_forward. */
static int inside_forward = 0;

static PyObject *str_call_impl;          /* "_call_impl" */
static PyObject *str_compiled_call_impl; /* "_compiled_call_impl" */

typedef struct {
    PyObject_HEAD
    PyObject *original;  /* the __call__ it replaced */
    PyObject *outermost; /* outermost(original, module, args, kwargs) */
    int torch_call;      /* original is torch's _wrapped_call_impl: call _call_impl directly */
    PyObject *plain;     /* a class whose outermost calls are no forward (a loss), or NULL */
    vectorcallfunc vectorcall;
} ModuleCall;

/* The dealloc of every type here that the garbage collector tracks (its tp_clear drops
 * what it holds). */
static void
gc_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_TYPE(self)->tp_clear(self);
    Py_TYPE(self)->tp_free(self);
}

/* A submodule's call, as torch's _wrapped_call_impl makes it. */
static PyObject *
inner_call(ModuleCall *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (!self->torch_call) {
        return PyObject_Vectorcall(self->original, args, nargs, kwnames);
    }
    PyObject *compiled = PyObject_GetAttr(args[0], str_compiled_call_impl);
    if (compiled == NULL) {
        return NULL;
    }
    if (compiled != Py_None) {
        PyObject *result = PyObject_Vectorcall(compiled, args + 1, nargs - 1, kwnames);
        Py_DECREF(compiled);
        return result;
    }
    Py_DECREF(compiled);
    return PyObject_VectorcallMethod(str_call_impl, (PyObject **)args, nargs, kwnames);
}

/* The outermost call: outermost(original, module, args, kwargs), with the flag set. */
static PyObject *
outermost_call(ModuleCall *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *positional = PyTuple_New(nargs - 1);
    if (positional == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 1; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(positional, i - 1, args[i]);
    }
    PyObject *keywords = PyDict_New();
    if (keywords == NULL) {
        Py_DECREF(positional);
        return NULL;
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (PyDict_SetItem(keywords, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
            Py_DECREF(positional);
            Py_DECREF(keywords);
            return NULL;
        }
    }
    PyObject *call[4] = {self->original, args[0], positional, keywords};
    inside_forward = 1;
    PyObject *result = PyObject_Vectorcall(self->outermost, call, 4, NULL);
    inside_forward = 0;
    Py_DECREF(positional);
    Py_DECREF(keywords);
    return result;
}

/* A training forward of the step cycle (below, with the other hooks of the cycle). */
static PyObject *forward_fast(ModuleCall *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames);

static PyObject *
module_call_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ModuleCall *self = (ModuleCall *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "Module.__call__ needs the module as its first argument");
        return NULL;
    }
    if (inside_forward) {
        return inner_call(self, args, nargs, kwnames);
    }
    if (self->plain != NULL) { /* a loss module: no span, and what it calls is inside it */
        int plain = PyObject_IsInstance(args[0], self->plain);
        if (plain < 0) {
            return NULL;
        }
        if (plain) {
            inside_forward = 1;
            PyObject *result = inner_call(self, args, nargs, kwnames);
            inside_forward = 0;
            return result;
        }
    }
    PyObject *result = forward_fast(self, args, nargs, kwnames);
    if (result != NULL || PyErr_Occurred()) {
        return result;
    }
    return outermost_call(self, args, nargs, kwnames);
}

static PyObject *
module_call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *original, *outermost, *plain = Py_None;
    int torch_call;
    static char *names[] = {"original", "outermost", "torch_call", "plain", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOp|O", names, &original, &outermost,
                                     &torch_call, &plain)) {
        return NULL;
    }
    ModuleCall *self = (ModuleCall *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    Py_INCREF(original);
    Py_INCREF(outermost);
    self->original = original;
    self->outermost = outermost;
    self->torch_call = torch_call;
    self->plain = plain == Py_None ? NULL : Py_NewRef(plain);
    self->vectorcall = module_call_vectorcall;
    return (PyObject *)self;
}

static int
module_call_traverse(ModuleCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->original);
    Py_VISIT(self->outermost);
    Py_VISIT(self->plain);
    return 0;
}

static int
module_call_clear(ModuleCall *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->outermost);
    Py_CLEAR(self->plain);
    return 0;
}

/* module.__call__ (looked up on an instance): a bound method, as for a function. */
static PyObject *
module_call_get(PyObject *self, PyObject *instance, PyObject *owner)
{
    if (instance == NULL || instance == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, instance);
}

static PyObject *
module_call_wrapped(ModuleCall *self, void *closure)
{
    Py_INCREF(self->original);
    return self->original;
}

static PyObject *
module_call_name(ModuleCall *self, void *closure)
{
    return PyUnicode_FromString("__call__");
}

static PyGetSetDef module_call_getset[] = {
    {"__wrapped__", (getter)module_call_wrapped, NULL, "the __call__ this one replaced", NULL},
    {"__name__", (getter)module_call_name, NULL, NULL, NULL},
    {"__qualname__", (getter)module_call_name, NULL, NULL, NULL},
    {NULL},
};

static PyTypeObject ModuleCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cirron.recording._hot.ModuleCall",
    .tp_doc = "ModuleCall(original, outermost, torch_call, plain=None): cirron's nn.Module.__call__.",
    .tp_basicsize = sizeof(ModuleCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = module_call_new,
    .tp_traverse = (traverseproc)module_call_traverse,
    .tp_clear = (inquiry)module_call_clear,
    .tp_dealloc = gc_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ModuleCall, vectorcall),
    .tp_descr_get = module_call_get,
    .tp_getset = module_call_getset,
};

/* ---------------------------------------------------------------------------------------
 * What the hook spans, the scopes and the mark all read: set once, by configure
 * (cirron.recording.hot, as it loads this module). Owned references; NULL until then.
 * ------------------------------------------------------------------------------------- */

static PyObject *sh_recorder;    /* cirron.recording.recorder: its .current */
static PyObject *sh_pending;     /* training_state.pending_fetches (a list) */
static PyObject *sh_open;        /* training_state.open_hook_spans (a list) */
static PyObject *sh_completed;   /* training_state.completed: [a completed step's span, loop] */
static PyObject *sh_context_var; /* the OTel context's ContextVar */
static PyObject *sh_span_key;    /* the context's key of the current span */
static PyObject *sh_scope_span;  /* cirron.otel.spans.ScopeSpan */
static PyObject *sh_time_ns;     /* time.time_ns */
static PyObject *sh_recorder_dict; /* the recorder module's namespace: its "current" */
static PyObject *sh_recorder_type; /* cirron.recording.recorder.Recorder (its fields are slots) */
static PyObject *sh_unset_status;  /* spans.UNSET_STATUS: a new span's status */
static PyObject *sh_tracer_state;  /* spans.TracerState: its processors and random_ids, slots */
static Py_ssize_t ts_at_processors, ts_at_random_ids;

/* The Recorder fields the twins read, several a step: by their slots' offsets. */
enum { REC_ENABLED, REC_TRAINING, REC_SESSION, REC_SESSION_CONTEXT, REC_LEAN, REC_PROCESSOR,
       REC_SETTINGS, REC_FIELDS };
static const char *rec_slots[REC_FIELDS] = {"enabled", "training", "session", "session_context",
                                            "lean", "processor", "settings"};
static PyObject *rec_names[REC_FIELDS]; /* the same names, interned */
static Py_ssize_t rec_at[REC_FIELDS];

static Py_ssize_t slot_offset(PyObject *type, const char *name);

/* The offsets of ``count`` slots of ``type`` into ``offsets``, and their names interned into
 * ``names`` (made once): 0, or -1 with an error (no such slot). */
static int
slot_offsets(PyObject *type, const char *const *slots, int count, Py_ssize_t *offsets,
             PyObject **names)
{
    for (int i = 0; i < count; i++) {
        offsets[i] = slot_offset(type, slots[i]);
        if (offsets[i] < 0) {
            return -1;
        }
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(slots[i])) == NULL) {
            return -1;
        }
    }
    return 0;
}
static PyObject *str_current; /* "current" (interned with the others, below) */

/* recorder.current: a new reference (None: no recorder), or NULL with an error. */
static PyObject *
current_recorder(void)
{
    if (sh_recorder_dict != NULL) {
        PyObject *rec = PyDict_GetItemWithError(sh_recorder_dict, str_current);
        if (rec != NULL) {
            return Py_NewRef(rec);
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    if (sh_recorder == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cirron's compiled helper is not configured");
        return NULL;
    }
    return PyObject_GetAttr(sh_recorder, str_current); /* (no "current" in it: its error) */
}

/* ``rec``'s field ``which`` (a new reference; NULL with an error): read by offset on a
 * Recorder, by name on anything else. */
static PyObject *
rec_field(PyObject *rec, int which)
{
    if (sh_recorder_type != NULL && (PyObject *)Py_TYPE(rec) == sh_recorder_type) {
        PyObject *value = *(PyObject **)((char *)rec + rec_at[which]);
        if (value != NULL) {
            return Py_NewRef(value);
        }
    }
    return PyObject_GetAttr(rec, rec_names[which]);
}

/* The ScopeSpan fields the twins read and write, for every span: by their slots' offsets
 * (every one is set where a span is made; spans.py). */
enum { SP_NAME, SP_TRACE_ID, SP_SPAN_ID, SP_PARENT, SP_ATTRIBUTES, SP_STATE, SP_START, SP_END,
       SP_EVENTS, SP_STATUS, SP_LINKS, SP_DEFERRED, SP_DROPPED_EVENTS, SP_FIELDS };
static const char *sp_slots[SP_FIELDS] = {
    "_name", "_trace_id", "_span_id", "_parent_span", "_attributes", "_state", "_start_time",
    "_end_time", "_events", "_status", "_links", "_deferred", "_dropped_events"};
static PyObject *sp_names[SP_FIELDS]; /* the same names, interned */
static Py_ssize_t sp_at[SP_FIELDS];

/* ``span``'s field ``which`` (a new reference; NULL with an error): by offset on a ScopeSpan,
 * by name (as a plain attribute) on anything else or a slot not set. */
static PyObject *
span_field(PyObject *span, int which)
{
    if ((PyObject *)Py_TYPE(span) == sh_scope_span) {
        PyObject *value = *(PyObject **)((char *)span + sp_at[which]);
        if (value != NULL) {
            return Py_NewRef(value);
        }
    }
    if (sp_names[which] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cirron's compiled helper is not configured");
        return NULL;
    }
    return PyObject_GenericGetAttr(span, sp_names[which]);
}

/* Set ``span``'s field ``which`` to ``value`` (borrowed): 0, or -1 with an error. */
static int
set_span_field(PyObject *span, int which, PyObject *value)
{
    if ((PyObject *)Py_TYPE(span) == sh_scope_span) {
        Py_XSETREF(*(PyObject **)((char *)span + sp_at[which]), Py_NewRef(value));
        return 0;
    }
    if (sp_names[which] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cirron's compiled helper is not configured");
        return -1;
    }
    return PyObject_GenericSetAttr(span, sp_names[which], value);
}

/* ``rec``'s field ``which`` is true: 1, false: 0, failed: -1. */
static int
rec_true(PyObject *rec, int which)
{
    PyObject *value = rec_field(rec, which);
    if (value == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

static PyObject *
configure(PyObject *module, PyObject *args, PyObject *kwargs)
{
    PyObject *f[11];
    static char *names[] = {"recorder", "pending", "open", "completed", "context_var",
                            "span_key", "scope_span", "time_ns", "recorder_type", "unset_status",
                            "tracer_state", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OO!O!O!OOO!OO!OO!", names, &f[0],
                                     &PyList_Type, &f[1], &PyList_Type, &f[2], &PyList_Type,
                                     &f[3], &f[4], &f[5], &PyType_Type, &f[6], &f[7],
                                     &PyType_Type, &f[8], &f[9], &PyType_Type, &f[10])) {
        return NULL;
    }
    Py_ssize_t at_processors = slot_offset(f[10], "processors");
    Py_ssize_t at_random_ids = at_processors < 0 ? -1 : slot_offset(f[10], "random_ids");
    if (at_random_ids < 0) {
        return NULL;
    }
    if (!PyContextVar_CheckExact(f[4]) || !PyModule_Check(f[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "context_var must be a contextvars.ContextVar, recorder a module");
        return NULL;
    }
    Py_ssize_t offsets[REC_FIELDS], span_offsets[SP_FIELDS];
    if (slot_offsets(f[8], rec_slots, REC_FIELDS, offsets, rec_names) < 0
        || slot_offsets(f[6], sp_slots, SP_FIELDS, span_offsets, sp_names) < 0) {
        return NULL;
    }
    PyObject **kept[10] = {&sh_recorder, &sh_pending, &sh_open, &sh_completed, &sh_context_var,
                           &sh_span_key, &sh_scope_span, &sh_time_ns, &sh_recorder_type,
                           &sh_unset_status};
    for (int i = 0; i < 10; i++) {
        Py_XSETREF(*kept[i], Py_NewRef(f[i]));
    }
    Py_XSETREF(sh_recorder_dict, Py_NewRef(PyModule_GetDict(f[0])));
    for (int i = 0; i < REC_FIELDS; i++) {
        rec_at[i] = offsets[i];
    }
    for (int i = 0; i < SP_FIELDS; i++) {
        sp_at[i] = span_offsets[i];
    }
    Py_XSETREF(sh_tracer_state, Py_NewRef(f[10]));
    ts_at_processors = at_processors;
    ts_at_random_ids = at_random_ids;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------
 * Hook spans: cirron.recording.hook_spans.begin/end and their _finished, compiled.
 *
 * begin notes a start time and the span's parent; end hands the finished span's fields to
 * the processor's queue, where the flush thread builds it. Everything that is not this
 * common path (a parent that is not one of cirron's open lean spans, a call that raised,
 * a span built while the call ran) goes to the pure-Python functions, which
 * configure_hook_spans hands over: the decisions stay in Python, where they can be read.
 * ------------------------------------------------------------------------------------- */

/* What configure_hook_spans was given (owned references; NULL until it is called); what
 * they share with the scopes and the mark is configure's (sh_*, above). */
static PyObject *hs_build_here;      /* hook_spans.build_here() */
static PyObject *hs_open_on;         /* scopes.open_on(rec, name, attributes, None) */
static PyObject *hs_end_built;       /* hook_spans._end_built(hook, parent, error, deferred, end_ns) */
static PyObject *hs_end_pure;        /* hook_spans' pure end(hook, error): for its own hook spans */
static PyObject *hs_finished_now;    /* ScopeSpan.finished(*fields): built on this thread */
static Py_ssize_t hs_wake_at;        /* NOTED_WAKE_AT */
static PyObject *hs_device;          /* torch_spans.CUDA: [torch.cuda once attached, or None] */
static PyObject *hs_device_timer;    /* torch_spans._device_timer(hook): sets its device_timer */

/* Names read or written as attributes (a ScopeSpan's fields are span_field's: by offset). */
static PyObject *str_current, *str_enabled, *str_training, *str_detail, *str_session,
    *str_session_context, *str_lean, *str_processor, *str_noted, *str_append,
    *str_noted_many, *str_initialized;

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *attributes;
    PyObject *start_ns;     /* time.time_ns() at begin (None: not noted, a span opened at once) */
    PyObject *current;      /* the current span at begin (None: nothing current) */
    PyObject *parent;       /* the lean span it is a child of; None once its span is built */
    PyObject *context;      /* the OTel context at begin */
    unsigned long thread;
    PyObject *opened;       /* once built while open: what close_span needs (else None) */
    PyObject *device_timer; /* None, or what gives the device time at the end */
} HookSpanObject;

/* No cycle runs through a hook span (nothing it holds refers back to it), so it is not
 * tracked by the garbage collector: three a step would bring young collections sooner. */
static void
hook_span_dealloc(HookSpanObject *self)
{
    Py_XDECREF(self->name);
    Py_XDECREF(self->attributes);
    Py_XDECREF(self->start_ns);
    Py_XDECREF(self->current);
    Py_XDECREF(self->parent);
    Py_XDECREF(self->context);
    Py_XDECREF(self->opened);
    Py_XDECREF(self->device_timer);
    PyObject_Free(self);
}

static PyMemberDef hook_span_members[] = {
    {"name", T_OBJECT, offsetof(HookSpanObject, name), 0, NULL},
    {"attributes", T_OBJECT, offsetof(HookSpanObject, attributes), 0, NULL},
    {"start_ns", T_OBJECT, offsetof(HookSpanObject, start_ns), 0, NULL},
    {"current", T_OBJECT, offsetof(HookSpanObject, current), 0, NULL},
    {"parent", T_OBJECT, offsetof(HookSpanObject, parent), 0, NULL},
    {"context", T_OBJECT, offsetof(HookSpanObject, context), 0, NULL},
    {"thread", T_ULONG, offsetof(HookSpanObject, thread), 0, NULL},
    {"opened", T_OBJECT, offsetof(HookSpanObject, opened), 0, NULL},
    {"device_timer", T_OBJECT, offsetof(HookSpanObject, device_timer), 0, NULL},
    {NULL},
};

static PyTypeObject HookSpanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cirron.recording._hot.HookSpan",
    .tp_doc = "A hook span from begin to end (cirron.recording.hook_spans.HookSpan, compiled).",
    .tp_basicsize = sizeof(HookSpanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)hook_span_dealloc,
    .tp_members = hook_span_members,
};

/* getattr(owner, name) is true: 1, false: 0, failed: -1. */
static int
attribute_true(PyObject *owner, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

static int
hook_spans_configured(void)
{
    if (sh_recorder == NULL || hs_build_here == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cirron's compiled hook spans are not configured");
        return 0;
    }
    return 1;
}

/* The current span of the OTel context ``context`` (new reference; NULL: none, no error). */
static PyObject *
span_of(PyObject *context)
{
    PyObject *span;
    if (PyDict_Check(context)) { /* an OTel Context is a dict */
        span = PyDict_GetItemWithError(context, sh_span_key);
        Py_XINCREF(span);
        return span;
    }
    span = PyObject_GetItem(context, sh_span_key);
    if (span == NULL && PyErr_ExceptionMatches(PyExc_KeyError)) {
        PyErr_Clear();
    }
    return span;
}

/* hook_spans.begin(name, attributes), and with ``device`` torch_spans.open_hook's device
 * timer too. */
static PyObject *
begin_impl(PyObject *name, PyObject *attributes, int device)
{
    if (!hook_spans_configured()) {
        return NULL;
    }
    PyObject *rec = current_recorder();
    if (rec == NULL) {
        return NULL;
    }
    if (rec == Py_None) {
        Py_DECREF(rec);
        Py_RETURN_NONE;
    }
    HookSpanObject *hook = NULL;
    PyObject *context = NULL, *current = NULL, *parent = NULL, *lean = NULL;
    int on = rec_true(rec, REC_ENABLED);
    if (on > 0) {
        PyObject *training = rec_field(rec, REC_TRAINING);
        on = training == NULL ? -1 : attribute_true(training, str_detail);
        Py_XDECREF(training);
    }
    if (on <= 0) {
        Py_DECREF(rec);
        if (on < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (PyList_GET_SIZE(sh_open) > 0) { /* a hook call inside another: the outer one is built */
        PyObject *done = PyObject_CallNoArgs(hs_build_here);
        if (done == NULL) {
            goto failed;
        }
        Py_DECREF(done);
    }
    if (PyContextVar_Get(sh_context_var, NULL, &context) < 0) {
        goto failed;
    }
    if (context == NULL) { /* (the OTel variable has a default: never) */
        context = Py_NewRef(Py_None);
    }
    current = context == Py_None ? NULL : span_of(context);
    if (current == NULL && PyErr_Occurred()) {
        goto failed;
    }
    if (current == NULL || current == Py_None) { /* at the top level: under cirron.session */
        Py_XDECREF(current);
        current = Py_NewRef(Py_None);
        parent = rec_field(rec, REC_SESSION);
        Py_SETREF(context, rec_field(rec, REC_SESSION_CONTEXT));
        if (parent == NULL || context == NULL) {
            goto failed;
        }
    }
    else {
        parent = Py_NewRef(current);
    }
    hook = PyObject_New(HookSpanObject, &HookSpanType);
    if (hook == NULL) {
        goto failed;
    }
    hook->name = Py_NewRef(name);
    hook->attributes = Py_NewRef(attributes);
    hook->start_ns = Py_NewRef(Py_None);
    hook->current = Py_NewRef(current);
    hook->parent = Py_NewRef(Py_None);
    hook->context = Py_NewRef(context);
    hook->thread = 0;
    hook->opened = Py_NewRef(Py_None);
    hook->device_timer = Py_NewRef(Py_None);
    int lean_parent = 0;
    if ((PyObject *)Py_TYPE(parent) == sh_scope_span) {
        PyObject *end_time = span_field(parent, SP_END);
        if (end_time == NULL) {
            goto failed;
        }
        lean_parent = end_time == Py_None;
        Py_DECREF(end_time);
        if (lean_parent) {
            lean = rec_field(rec, REC_LEAN);
            if (lean == NULL) {
                goto failed;
            }
            lean_parent = lean != Py_None;
        }
    }
    if (lean_parent) {
        Py_XSETREF(hook->parent, Py_NewRef(parent));
        hook->thread = PyThread_get_thread_ident();
        Py_XSETREF(hook->start_ns, PyObject_CallNoArgs(sh_time_ns));
        if (hook->start_ns == NULL) {
            goto failed;
        }
        if (PyList_Append(sh_open, (PyObject *)hook) < 0) {
            goto failed;
        }
    }
    else { /* the SDK decides (a sampler, a foreign parent): a real span from the start */
        PyObject *call[4] = {rec, name, attributes, Py_None};
        PyObject *opened = PyObject_Vectorcall(hs_open_on, call, 4, NULL);
        if (opened == NULL) {
            goto failed;
        }
        Py_XSETREF(hook->opened, opened);
    }
    if (device && hs_device != NULL) {
        PyObject *cuda = PyList_GET_SIZE(hs_device) > 0 ? PyList_GET_ITEM(hs_device, 0) : Py_None;
        if (cuda != Py_None) { /* torch.cuda, once in use: the call's time on the device too */
            int in_use = attribute_true(cuda, str_initialized);
            if (in_use < 0) {
                goto failed;
            }
            if (in_use) {
                PyObject *timed = PyObject_CallOneArg(hs_device_timer, (PyObject *)hook);
                if (timed == NULL) {
                    goto failed;
                }
                Py_DECREF(timed);
            }
        }
    }
    Py_DECREF(rec);
    Py_DECREF(context);
    Py_DECREF(current);
    Py_DECREF(parent);
    Py_XDECREF(lean);
    return (PyObject *)hook;

failed:
    Py_DECREF(rec);
    Py_XDECREF(context);
    Py_XDECREF(current);
    Py_XDECREF(parent);
    Py_XDECREF(lean);
    /* A hook already listed stays listed (build_here and build_open take it), as in the pure
     * twin, where a failing device timer leaves the noted hook span behind the same way. */
    Py_XDECREF(hook);
    return NULL;
}

static PyObject *
two_arguments(const char *function, PyObject *const *args, Py_ssize_t nargs, int device)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes name and attributes", function);
        return NULL;
    }
    return begin_impl(args[0], args[1], device);
}

static PyObject *
hook_begin(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return two_arguments("begin", args, nargs, 0);
}

static PyObject *
hook_open(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return two_arguments("open_hook", args, nargs, 1);
}

/* hook_spans._finished: the fields of an ended hook span, to the flush thread to build (or
 * built here when there is none). Returns 0, or -1 with an exception set. */
static int
finished_impl(PyObject *const *fields)
{
    PyObject *rec = current_recorder();
    if (rec == NULL) {
        return -1;
    }
    PyObject *processor = rec == Py_None ? Py_NewRef(Py_None) : rec_field(rec, REC_PROCESSOR);
    Py_DECREF(rec);
    if (processor == NULL) {
        return -1;
    }
    PyObject *noted = processor == Py_None ? Py_NewRef(Py_None) : PyObject_GetAttr(processor, str_noted);
    if (noted == NULL) {
        Py_DECREF(processor);
        return -1;
    }
    int result = 0;
    if (noted == Py_None) {
        PyObject *span = PyObject_Vectorcall(hs_finished_now, fields, 7, NULL);
        result = span == NULL ? -1 : 0;
        Py_XDECREF(span);
    }
    else {
        PyObject *record = PyTuple_New(7);
        if (record == NULL) {
            result = -1;
        }
        else {
            for (int i = 0; i < 7; i++) {
                PyTuple_SET_ITEM(record, i, Py_NewRef(fields[i]));
            }
            /* It waits for the flush thread (four a torch step), and nothing refers back to
             * it: out of the collector's sight, like the span it becomes (untrack_ended). */
            PyObject_GC_UnTrack(record);
            PyObject *appended = PyObject_CallMethodOneArg(noted, str_append, record);
            Py_DECREF(record);
            Py_XDECREF(appended);
            Py_ssize_t waiting = appended == NULL ? -1 : PyObject_Length(noted);
            if (waiting < 0) {
                result = -1;
            }
            else if (waiting % hs_wake_at == 0) { /* (once every wake_at: hook_spans._finished) */
                PyObject *woken = PyObject_CallMethodNoArgs(processor, str_noted_many);
                result = woken == NULL ? -1 : 0;
                Py_XDECREF(woken);
            }
        }
    }
    Py_DECREF(noted);
    Py_DECREF(processor);
    return result;
}

static PyObject *
hook_finished(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "_finished() takes name, parent, attributes, context, start_ns, end_ns, deferred");
        return NULL;
    }
    if (!hook_spans_configured() || finished_impl(args) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Take ``hook`` off the open hook spans, if it is there (another thread's build_open may
 * have taken it). By identity, from the end: the newest is nearly always the one. */
static int
unlist(PyObject *hook)
{
    for (Py_ssize_t i = PyList_GET_SIZE(sh_open) - 1; i >= 0; i--) {
        if (PyList_GET_ITEM(sh_open, i) == hook) {
            return PySequence_DelItem(sh_open, i);
        }
    }
    return 0;
}

/* hook_spans.end(hook, error=None). */
static PyObject *
hook_end(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *error = Py_None;
    if (nargs == 2 && nkw == 0) {
        error = args[1];
    }
    else if (nargs == 1 && nkw == 1
             && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "error") == 0) {
        error = args[1];
    }
    else if (!(nargs == 1 && nkw == 0)) {
        PyErr_SetString(PyExc_TypeError, "end() takes a hook span and, optionally, error");
        return NULL;
    }
    if (!hook_spans_configured()) {
        return NULL;
    }
    if (!Py_IS_TYPE(args[0], &HookSpanType)) { /* the pure twin's (or not a hook span) */
        PyObject *call[2] = {args[0], error};
        return PyObject_Vectorcall(hs_end_pure, call, 2, NULL);
    }
    HookSpanObject *hook = (HookSpanObject *)args[0];
    PyObject *deferred = Py_None;
    if (hook->device_timer != Py_None) {
        deferred = PyObject_CallNoArgs(hook->device_timer);
        if (deferred == NULL) {
            return NULL;
        }
    }
    else {
        Py_INCREF(deferred);
    }
    PyObject *result = NULL;
    PyObject *end_ns = PyObject_CallNoArgs(sh_time_ns);
    if (end_ns == NULL) {
        Py_DECREF(deferred);
        return NULL;
    }
    PyObject *parent = Py_NewRef(hook->parent);
    if (hook->opened == Py_None && error == Py_None) {
        Py_XSETREF(hook->parent, Py_NewRef(Py_None)); /* built from here on: not again */
        if (unlist((PyObject *)hook) < 0) {
            goto done;
        }
        if (hook->opened == Py_None) {
            PyObject *fields[7] = {hook->name, parent, hook->attributes, hook->context,
                                   hook->start_ns, end_ns, deferred};
            if (finished_impl(fields) == 0) {
                result = Py_NewRef(Py_None);
            }
            goto done;
        }
    }
    PyObject *call[5] = {(PyObject *)hook, parent, error, deferred, end_ns};
    result = PyObject_Vectorcall(hs_end_built, call, 5, NULL);
done:
    Py_DECREF(parent);
    Py_DECREF(deferred);
    Py_DECREF(end_ns);
    return result;
}

static PyObject *
configure_hook_spans(PyObject *module, PyObject *args, PyObject *kwargs)
{
    PyObject *build_here, *open_on, *end_built, *end_pure, *finished_now;
    Py_ssize_t wake_at;
    static char *names[] = {"build_here", "open_on", "end_built", "end_pure", "finished_now",
                            "wake_at", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOOOOn", names, &build_here, &open_on,
                                     &end_built, &end_pure, &finished_now, &wake_at)) {
        return NULL;
    }
    if (wake_at <= 0) {
        PyErr_SetString(PyExc_ValueError, "wake_at must be positive");
        return NULL;
    }
    Py_XSETREF(hs_build_here, Py_NewRef(build_here));
    Py_XSETREF(hs_open_on, Py_NewRef(open_on));
    Py_XSETREF(hs_end_built, Py_NewRef(end_built));
    Py_XSETREF(hs_end_pure, Py_NewRef(end_pure));
    Py_XSETREF(hs_finished_now, Py_NewRef(finished_now));
    hs_wake_at = wake_at;
    Py_RETURN_NONE;
}

static PyObject *
watch_device(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "watch_device() takes a list ([torch.cuda or None]) and timer(hook)");
        return NULL;
    }
    Py_XSETREF(hs_device, Py_NewRef(args[0]));
    Py_XSETREF(hs_device_timer, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------
 * ci.mark, compiled: a float under a name, as an event on the innermost open lean span.
 *
 * Only the common case runs here: mark(name, value) or kind="point", a str name, a float
 * value, on one of cirron's open lean spans with room for the event, nothing waiting to be
 * settled first (a batch fetch, a hook span to build). Everything else goes to the pure
 * cirron.recording.marks.mark it was made with, which checks it all again: what a mark
 * means, and every error a mark raises, stay in Python.
 * ------------------------------------------------------------------------------------- */

/* The head of both compiled twin types (Mark, Twin): the pure twin comes first after it, so
 * what reads a function reads the pure twin's (its name, its text, its signature) through
 * one set of getters. */
typedef struct {
    PyObject_HEAD
    PyObject *pure;
} PureHead;

static PyObject *
pure_attribute(PureHead *self, void *name)
{
    if (self->pure == NULL) {
        PyErr_SetString(PyExc_AttributeError, (const char *)name);
        return NULL;
    }
    return PyObject_GetAttrString(self->pure, (const char *)name);
}

static PyObject *
pure_wrapped(PureHead *self, void *closure)
{
    if (self->pure == NULL) {
        PyErr_SetString(PyExc_AttributeError, "__wrapped__");
        return NULL;
    }
    return Py_NewRef(self->pure);
}

static PyGetSetDef pure_getset[] = {
    {"__wrapped__", (getter)pure_wrapped, NULL, "the pure-Python twin", NULL},
    {"__name__", (getter)pure_attribute, NULL, NULL, "__name__"},
    {"__qualname__", (getter)pure_attribute, NULL, NULL, "__qualname__"},
    {"__module__", (getter)pure_attribute, NULL, NULL, "__module__"},
    {"__doc__", (getter)pure_attribute, NULL, NULL, "__doc__"},
    {NULL},
};

typedef struct {
    PyObject_HEAD
    PyObject *pure;        /* cirron.recording.marks.mark, the pure twin (first: PureHead) */
    PyObject *event;       /* cirron.otel.spans.MarkEvent (its fields are slots) */
    PyObject *value_key;   /* semconv.MARK_VALUE */
    Py_ssize_t at_name, at_attributes, at_timestamp; /* MarkEvent's slots, as offsets */
    vectorcallfunc vectorcall;
} MarkObject;
_Static_assert(offsetof(MarkObject, pure) == offsetof(PureHead, pure), "Mark starts as PureHead");

static PyObject *str_point, *str_kind, *str_max_events;

/* The span a fast mark goes on (new reference), or NULL with no error: the pure twin's. */
static PyObject *
mark_target(MarkObject *self)
{
    PyObject *rec = current_recorder();
    if (rec == NULL) {
        return NULL;
    }
    int on = rec == Py_None ? 0 : rec_true(rec, REC_ENABLED);
    Py_DECREF(rec);
    if (on <= 0 || PyList_GET_SIZE(sh_pending) > 0 || PyList_GET_SIZE(sh_open) > 0) {
        return NULL;
    }
    PyObject *context = NULL;
    if (PyContextVar_Get(sh_context_var, NULL, &context) < 0 || context == NULL
        || !PyDict_Check(context)) {
        Py_XDECREF(context);
        return NULL;
    }
    PyObject *span = PyDict_GetItemWithError(context, sh_span_key);
    Py_XINCREF(span);
    Py_DECREF(context);
    if (span == NULL || (PyObject *)Py_TYPE(span) != sh_scope_span
        || (PyList_GET_SIZE(sh_completed) > 0 && PyList_GET_ITEM(sh_completed, 0) == span)) {
        Py_XDECREF(span);
        return NULL;
    }
    PyObject *end_time = span_field(span, SP_END);
    Py_XDECREF(end_time);
    if (end_time != Py_None) {
        Py_DECREF(span);
        return NULL;
    }
    return span;
}

/* The span's list of events with room for one more (new reference), or NULL with no error. */
static PyObject *
room_on(PyObject *span)
{
    PyObject *events = span_field(span, SP_EVENTS);
    if (events == NULL) {
        return NULL;
    }
    if (PyTuple_CheckExact(events) && PyTuple_GET_SIZE(events) == 0) { /* the first event */
        Py_SETREF(events, PyList_New(0));
        if (events == NULL || set_span_field(span, SP_EVENTS, events) < 0) {
            Py_XDECREF(events);
            return NULL;
        }
        return events;
    }
    if (!PyList_CheckExact(events)) { /* at the limit once: a deque, the pure twin's */
        Py_DECREF(events);
        return NULL;
    }
    PyObject *state = span_field(span, SP_STATE);
    PyObject *limit = state == NULL ? NULL : PyObject_GetAttr(state, str_max_events);
    Py_XDECREF(state);
    Py_ssize_t most = limit == NULL ? -1 : PyLong_AsSsize_t(limit);
    Py_XDECREF(limit);
    if (most < 0 || PyList_GET_SIZE(events) >= most) {
        Py_DECREF(events);
        return NULL;
    }
    return events;
}

static PyObject *
mark_event(MarkObject *self, PyObject *name, PyObject *value)
{
    PyObject *attributes = PyDict_New();
    if (attributes == NULL) {
        return NULL;
    }
    if (PyDict_SetItem(attributes, self->value_key, value) < 0) {
        Py_DECREF(attributes);
        return NULL;
    }
    PyObject *timestamp = PyObject_CallNoArgs(sh_time_ns);
    if (timestamp == NULL) {
        Py_DECREF(attributes);
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)self->event;
    PyObject *event = type->tp_alloc(type, 0);
    if (event == NULL) {
        Py_DECREF(attributes);
        Py_DECREF(timestamp);
        return NULL;
    }
    /* The slots are empty (NULL) in a new object: each takes its reference. */
    *(PyObject **)((char *)event + self->at_name) = Py_NewRef(name);
    *(PyObject **)((char *)event + self->at_attributes) = attributes;
    *(PyObject **)((char *)event + self->at_timestamp) = timestamp;
    /* Its name, a dict of a float and an int close no cycle: out of the collector's sight, as
     * an ended span (see untrack_ended). */
    PyObject_GC_UnTrack(event);
    return event;
}

static PyObject *
mark_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    MarkObject *self = (MarkObject *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    int point = nargs == 2 && nkw == 0;
    if (!point && nargs + nkw == 3 && nargs >= 2 && PyUnicode_CheckExact(args[2])
        && (nkw == 0 || PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), str_kind) == 0)) {
        point = PyUnicode_Compare(args[2], str_point) == 0;
    }
    if (point && sh_recorder != NULL && PyUnicode_CheckExact(args[0])
        && PyUnicode_GET_LENGTH(args[0]) > 0 && PyFloat_CheckExact(args[1])) {
        PyObject *span = mark_target(self);
        PyObject *events = span == NULL || PyErr_Occurred() ? NULL : room_on(span);
        Py_XDECREF(span);
        if (events != NULL) {
            PyObject *event = mark_event(self, args[0], args[1]);
            int added = event == NULL ? -1 : PyList_Append(events, event);
            Py_XDECREF(event);
            Py_DECREF(events);
            if (added < 0) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
        PyErr_Clear(); /* whatever failed on the way, the pure twin looks at it all again */
    }
    return PyObject_Vectorcall(self->pure, args, nargsf, kwnames);
}

/* A slot's offset in the objects of ``type`` (-1 with an error: no such slot). */
static Py_ssize_t
slot_offset(PyObject *type, const char *name)
{
    PyObject *descriptor = PyDict_GetItemString(((PyTypeObject *)type)->tp_dict, name);
    if (descriptor == NULL || !Py_IS_TYPE(descriptor, &PyMemberDescr_Type)
        || ((PyMemberDescrObject *)descriptor)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s must have a slot %s", ((PyTypeObject *)type)->tp_name,
                     name);
        return -1;
    }
    return ((PyMemberDescrObject *)descriptor)->d_member->offset;
}

static PyObject *
mark_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *fields[3];
    static char *names[] = {"pure", "event", "value_key", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OO!O", names, &fields[0], &PyType_Type,
                                     &fields[1], &fields[2])) {
        return NULL;
    }
    Py_ssize_t at_name = slot_offset(fields[1], "_name");
    Py_ssize_t at_attributes = at_name < 0 ? -1 : slot_offset(fields[1], "_attributes");
    Py_ssize_t at_timestamp = at_attributes < 0 ? -1 : slot_offset(fields[1], "_timestamp");
    if (at_timestamp < 0) {
        return NULL;
    }
    MarkObject *self = (MarkObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    PyObject **slots[3] = {&self->pure, &self->event, &self->value_key};
    for (int i = 0; i < 3; i++) {
        *slots[i] = Py_NewRef(fields[i]);
    }
    self->at_name = at_name;
    self->at_attributes = at_attributes;
    self->at_timestamp = at_timestamp;
    self->vectorcall = mark_vectorcall;
    return (PyObject *)self;
}

static int
mark_traverse(MarkObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->pure);
    Py_VISIT(self->event);
    Py_VISIT(self->value_key);
    return 0;
}

static int
mark_clear(MarkObject *self)
{
    Py_CLEAR(self->pure);
    Py_CLEAR(self->event);
    Py_CLEAR(self->value_key);
    return 0;
}

static PyTypeObject MarkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cirron.recording._hot.Mark",
    .tp_basicsize = sizeof(MarkObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = mark_new,
    .tp_traverse = (traverseproc)mark_traverse,
    .tp_clear = (inquiry)mark_clear,
    .tp_dealloc = gc_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(MarkObject, vectorcall),
    .tp_getset = pure_getset,
};

/* ---------------------------------------------------------------------------------------
 * ci.scope, compiled: scope(name), Scope.__enter__ and Scope.__exit__ on the common path.
 *
 * The common path: a scope with a str name and no attributes given; entered on a thread
 * where one of cirron's lean spans is open (or at the top level, under cirron.session),
 * nothing waiting to be settled first, within the nesting limit; left without an error, in
 * the order it was entered. Everything else is the pure twin's (cirron.recording.scopes),
 * from the start: these decide nothing before they know the whole call is theirs.
 * ScopeSpan itself (its start, its end, the span processors) stays in Python.
 * ------------------------------------------------------------------------------------- */

/* What configure_scopes was given (owned references; NULL until it is called); what they
 * share with the hook spans and the mark is configure's (sh_*). */
static PyObject *sc_enclosing, *sc_depth_key, *sc_context, *sc_restore, *sc_scope,
    *sc_random_bits, *sc_sixty_four, *sc_open_on, *sc_close_span, *sc_zero;
static PyObject *sc_empty; /* (): tp_new's arguments, a new span's events and links */
static Py_ssize_t sc_max_depth;
/* The offsets of Scope's slots: name, attributes, span, start_ns, _opened. */
static Py_ssize_t at_scope_name, at_scope_attributes, at_scope_span, at_scope_start,
    at_scope_opened;
static PyObject *str_end, *str_random_ids, *str_new_span_id, *str_processors,
    *str_span_processors, *str_on_start, *str_on_end;

#define SLOT(object, offset) (*(PyObject **)((char *)(object) + (offset)))

enum { SCOPE_NEW, SCOPE_ENTER, SCOPE_EXIT, PROCESSOR_ON_START, PROCESSOR_ON_END, BATCHES_NEXT };

typedef struct {
    PyObject_HEAD
    PyObject *pure; /* the pure twin, which runs everything off the common path (PureHead) */
    int which;      /* SCOPE_NEW (ci.scope), SCOPE_ENTER, SCOPE_EXIT, PROCESSOR_ON_START/END,
                     * BATCHES_NEXT (ci.batches' __next__) */
    vectorcallfunc vectorcall;
} TwinObject;
_Static_assert(offsetof(TwinObject, pure) == offsetof(PureHead, pure), "Twin starts as PureHead");

/* configure and configure_scopes were called: the compiled scopes may run. */
static int
scopes_configured(void)
{
    return sh_recorder != NULL && sc_scope != NULL;
}

/* recorder.current, when it records: a new reference, or NULL with no error (not here). */
static PyObject *
recording(PyObject *recorder_module)
{
    PyObject *rec = current_recorder();
    if (rec == NULL || rec == Py_None) {
        Py_XDECREF(rec);
        PyErr_Clear();
        return NULL;
    }
    int on = rec_true(rec, REC_ENABLED);
    if (on <= 0) {
        Py_DECREF(rec);
        PyErr_Clear();
        return NULL;
    }
    return rec;
}

/* scope(name): a Scope, made here (1); 0: the pure twin's; -1: an error. */
static PyObject *
scope_new_fast(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs != 1 || kwnames != NULL || !PyUnicode_CheckExact(args[0])
        || PyUnicode_GET_LENGTH(args[0]) == 0) {
        return NULL;
    }
    PyObject *rec = recording(sh_recorder);
    if (rec == NULL) {
        return NULL;
    }
    Py_DECREF(rec);
    PyObject *attributes = PyDict_New();
    if (attributes == NULL) {
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)sc_scope;
    PyObject *scope = type->tp_alloc(type, 0);
    if (scope == NULL) {
        Py_DECREF(attributes);
        return NULL;
    }
    SLOT(scope, at_scope_name) = Py_NewRef(args[0]);
    SLOT(scope, at_scope_attributes) = attributes;
    SLOT(scope, at_scope_span) = Py_NewRef(Py_None);
    SLOT(scope, at_scope_start) = Py_NewRef(Py_None);
    return scope;
}

/* A tracer state's field (a new reference; NULL with an error): by its slot's ``offset`` on
 * a TracerState, by ``name`` on anything else or a slot not set. */
static PyObject *
state_field(PyObject *state, Py_ssize_t offset, PyObject *name)
{
    if (sh_tracer_state != NULL && (PyObject *)Py_TYPE(state) == sh_tracer_state) {
        PyObject *value = *(PyObject **)((char *)state + offset);
        if (value != NULL) {
            return Py_NewRef(value);
        }
    }
    return PyObject_GetAttr(state, name);
}

/* ScopeSpan(name, trace_id, parent, attributes, state, parent_context, start_ns), as its
 * __init__ makes it (new reference): the same fields, then each processor's on_start. Called
 * where scopes_configured(): configure and configure_scopes made what it sets. */
static PyObject *
new_scope_span(PyObject *const *fields)
{
    PyObject *state = fields[4];
    PyObject *random = state_field(state, ts_at_random_ids, str_random_ids);
    int random_ids = random == NULL ? -1 : PyObject_IsTrue(random);
    Py_XDECREF(random);
    if (random_ids < 0) {
        return NULL;
    }
    PyObject *span_id = random_ids ? PyObject_CallOneArg(sc_random_bits, sc_sixty_four) : NULL;
    if (span_id == NULL && random_ids) {
        return NULL;
    }
    if (span_id == NULL || !PyObject_IsTrue(span_id)) { /* 0 is invalid: the generator again */
        Py_XSETREF(span_id, PyObject_CallMethodNoArgs(state, str_new_span_id));
        if (span_id == NULL) {
            return NULL;
        }
    }
    PyObject *start = fields[6] != Py_None ? Py_NewRef(fields[6]) : PyObject_CallNoArgs(sh_time_ns);
    /* tp_new, not tp_alloc: object.__new__ also lays out the instance's attributes as
     * every ScopeSpan's (CPython's shared keys); set on a bare object they made it a dict. */
    PyTypeObject *type = (PyTypeObject *)sh_scope_span;
    PyObject *span = start == NULL ? NULL : type->tp_new(type, sc_empty, NULL);
    if (span == NULL) {
        Py_DECREF(span_id);
        Py_XDECREF(start);
        return NULL;
    }
    /* Every slot, as __init__ sets them (none was set: nothing to release). */
    PyObject *values[SP_FIELDS] = {
        [SP_NAME] = fields[0], [SP_TRACE_ID] = fields[1], [SP_SPAN_ID] = span_id,
        [SP_PARENT] = fields[2], [SP_ATTRIBUTES] = fields[3], [SP_STATE] = state,
        [SP_START] = start, [SP_END] = Py_None, [SP_EVENTS] = sc_empty,
        [SP_STATUS] = sh_unset_status, [SP_LINKS] = sc_empty, [SP_DEFERRED] = Py_None,
        [SP_DROPPED_EVENTS] = sc_zero};
    for (int i = 0; i < SP_FIELDS; i++) {
        *(PyObject **)((char *)span + sp_at[i]) = Py_NewRef(values[i]);
    }
    Py_DECREF(span_id);
    Py_DECREF(start);
    PyObject *processors = state_field(state, ts_at_processors, str_processors);
    PyObject *each = processors == NULL ? NULL : PyObject_GetAttr(processors, str_span_processors);
    Py_XDECREF(processors);
    if (each == NULL || !PyTuple_Check(each)) {
        if (each != NULL) {
            PyErr_SetString(PyExc_TypeError, "the span processors are not a tuple");
        }
        Py_XDECREF(each);
        Py_DECREF(span);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(each); i++) {
        PyObject *call[3] = {PyTuple_GET_ITEM(each, i), span, fields[5]};
        PyObject *done = PyObject_VectorcallMethod(str_on_start, call,
                                                   3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (done == NULL) {
            Py_DECREF(each);
            Py_DECREF(span);
            return NULL;
        }
        Py_DECREF(done);
    }
    Py_DECREF(each);
    return span;
}

/* ScopeSpan.end(end_ns) (0, or -1 with an error): ended once, then each processor's on_end. As in
 * the pure end, nothing runs between the test and the store that could switch threads. */
static int
end_scope_span(PyObject *span, PyObject *end_ns)
{
    if ((PyObject *)Py_TYPE(span) != sh_scope_span) { /* an SDK span (the pure twin's) */
        PyObject *ended = end_ns == Py_None ? PyObject_CallMethodNoArgs(span, str_end)
                                            : PyObject_CallMethodOneArg(span, str_end, end_ns);
        Py_XDECREF(ended);
        return ended == NULL ? -1 : 0;
    }
    PyObject *stamp = end_ns != Py_None ? Py_NewRef(end_ns) : PyObject_CallNoArgs(sh_time_ns);
    if (stamp == NULL) {
        return -1;
    }
    PyObject *end_time = span_field(span, SP_END);
    if (end_time == NULL || end_time != Py_None) {
        Py_XDECREF(end_time);
        Py_DECREF(stamp);
        return end_time == NULL ? -1 : 0;
    }
    Py_DECREF(end_time);
    int set = set_span_field(span, SP_END, stamp);
    Py_DECREF(stamp);
    if (set < 0) {
        return -1;
    }
    PyObject *state = span_field(span, SP_STATE);
    PyObject *processors =
        state == NULL ? NULL : state_field(state, ts_at_processors, str_processors);
    PyObject *each = processors == NULL ? NULL : PyObject_GetAttr(processors, str_span_processors);
    Py_XDECREF(state);
    Py_XDECREF(processors);
    if (each == NULL || !PyTuple_Check(each)) {
        if (each != NULL) {
            PyErr_SetString(PyExc_TypeError, "the span processors are not a tuple");
        }
        Py_XDECREF(each);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(each); i++) {
        PyObject *call[2] = {PyTuple_GET_ITEM(each, i), span};
        PyObject *done = PyObject_VectorcallMethod(str_on_end, call,
                                                   2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (done == NULL) {
            Py_DECREF(each);
            return -1;
        }
        Py_DECREF(done);
    }
    Py_DECREF(each);
    return 0;
}

/* Scope.__enter__ on the common path: the scope (new reference), or NULL with no error when
 * it is not the common path, or NULL with an error. */
static PyObject *
scope_enter_fast(PyObject *self)
{
    PyObject *attributes = SLOT(self, at_scope_attributes);
    PyObject *name = SLOT(self, at_scope_name);
    PyObject *start_ns = SLOT(self, at_scope_start);
    if (attributes == NULL || !PyDict_CheckExact(attributes) || name == NULL || start_ns == NULL
        || PyList_GET_SIZE(sh_pending) > 0 || PyList_GET_SIZE(sh_open) > 0) {
        return NULL;
    }
    PyObject *rec = recording(sh_recorder);
    if (rec == NULL) {
        return NULL;
    }
    PyObject *previous = NULL, *parent = NULL, *parent_context = NULL, *lean = NULL;
    PyObject *span = NULL, *context = NULL, *token = NULL, *result = NULL;
    if (PyContextVar_Get(sh_context_var, NULL, &previous) < 0 || previous == NULL
        || !PyDict_Check(previous)) {
        goto other;
    }
    Py_ssize_t depth = 0;
    PyObject *held = PyDict_GetItemWithError(previous, sc_depth_key);
    if (held != NULL) {
        depth = PyLong_CheckExact(held) ? PyLong_AsSsize_t(held) : -1;
    }
    if (depth < 0 || depth >= sc_max_depth || PyErr_Occurred()) {
        goto other;
    }
    PyObject *current = PyDict_GetItemWithError(previous, sh_span_key); /* borrowed */
    if (current != NULL && current != Py_None && PyList_GET_SIZE(sh_completed) > 0
        && PyList_GET_ITEM(sh_completed, 0) == current) {
        goto other; /* perhaps after the training loop: the pure twin asks */
    }
    if (current == NULL || current == Py_None) { /* at the top level: under cirron.session */
        parent = rec_field(rec, REC_SESSION);
        parent_context = rec_field(rec, REC_SESSION_CONTEXT);
    }
    else {
        parent = Py_NewRef(current);
        parent_context = Py_NewRef(previous);
    }
    if (parent == NULL || parent_context == NULL || (PyObject *)Py_TYPE(parent) != sh_scope_span) {
        goto other;
    }
    PyObject *end_time = span_field(parent, SP_END);
    Py_XDECREF(end_time);
    if (end_time != Py_None) {
        goto other;
    }
    lean = rec_field(rec, REC_LEAN);
    if (lean == NULL || lean == Py_None) {
        goto other;
    }
    PyObject *trace_id = span_field(parent, SP_TRACE_ID);
    PyObject *copied = trace_id == NULL ? NULL : PyDict_Copy(attributes);
    if (copied == NULL) {
        Py_XDECREF(trace_id);
        goto other;
    }
    /* From here on the scope is ours: a failure is an error, as in the pure twin. */
    PyObject *fields[7] = {name, trace_id, parent, copied, lean, parent_context, start_ns};
    span = new_scope_span(fields);
    Py_DECREF(trace_id);
    Py_DECREF(copied);
    if (span == NULL) {
        goto failed;
    }
    context = PyObject_CallNoArgs(sc_context);
    if (context == NULL || PyDict_Update(context, previous) < 0
        || PyDict_SetItem(context, sh_span_key, span) < 0) {
        goto failed;
    }
    PyObject *deeper = PyLong_FromSsize_t(depth + 1);
    if (deeper == NULL || PyDict_SetItem(context, sc_depth_key, deeper) < 0) {
        Py_XDECREF(deeper);
        goto failed;
    }
    Py_DECREF(deeper);
    token = PyContextVar_Set(sh_context_var, context);
    if (token == NULL) {
        goto failed;
    }
    PyObject *opened = PyTuple_Pack(3, span, token, previous);
    if (opened == NULL) {
        goto failed;
    }
    Py_XSETREF(SLOT(self, at_scope_opened), opened);
    Py_XSETREF(SLOT(self, at_scope_span), Py_NewRef(span));
    result = Py_NewRef(self);
    goto failed; /* (the common clean-up) */

other:
    PyErr_Clear();
failed:
    Py_DECREF(rec);
    Py_XDECREF(previous);
    Py_XDECREF(parent);
    Py_XDECREF(parent_context);
    Py_XDECREF(lean);
    Py_XDECREF(span);
    Py_XDECREF(context);
    Py_XDECREF(token);
    return result;
}

/* Scope.__exit__ on the common path: 1 done, 0 the pure twin's, -1 an error. */
static int
scope_exit_fast(PyObject *self, PyObject *error)
{
    PyObject *span = SLOT(self, at_scope_span);
    PyObject *opened = SLOT(self, at_scope_opened);
    if (span == NULL || span == Py_None || error != Py_None || opened == NULL
        || !PyTuple_CheckExact(opened) || PyTuple_GET_SIZE(opened) != 3
        || PyTuple_GET_ITEM(opened, 0) != span) {
        return 0;
    }
    int enclosing = PySet_Contains(sc_enclosing, span);
    if (enclosing != 0) { /* an epoch or step the hooks opened inside ends with it */
        PyErr_Clear();
        return 0;
    }
    Py_INCREF(span);
    Py_INCREF(opened);
    Py_SETREF(SLOT(self, at_scope_span), Py_NewRef(Py_None));
    int result = -1;
    if (end_scope_span(span, Py_None) < 0) {
        goto done;
    }
    PyObject *context = NULL;
    if (PyContextVar_Get(sh_context_var, NULL, &context) < 0) {
        goto done;
    }
    PyObject *current = context != NULL && PyDict_Check(context)
                            ? PyDict_GetItemWithError(context, sh_span_key) : NULL;
    Py_XDECREF(context);
    if (current == span) { /* ended where it began, on top of the context */
        if (PyContextVar_Reset(sh_context_var, PyTuple_GET_ITEM(opened, 1)) == 0) {
            result = 1;
            goto done;
        }
        if (!PyErr_ExceptionMatches(PyExc_ValueError)
            && !PyErr_ExceptionMatches(PyExc_RuntimeError)) {
            goto done;
        }
    }
    PyErr_Clear(); /* another context (a generator moved): the pure twin's _restore */
    PyObject *restored = PyObject_CallFunctionObjArgs(sc_restore, span, opened, NULL);
    result = restored == NULL ? -1 : 1;
    Py_XDECREF(restored);
done:
    Py_DECREF(span);
    Py_DECREF(opened);
    return result;
}

/* ---------------------------------------------------------------------------------------
 * The span processor's on_start and on_end (cirron.otel.processor.RingBufferSpanProcessor),
 * for one of cirron's lean spans: what the pure methods do.
 *
 * What a processor is made with (its counters, its open spans, its ring, its store) is
 * bound once in __init__ and rebound only after it stopped (after a fork), so it is read
 * once per processor and kept here, beside a weak reference that forgets it when the
 * processor goes; whether it stopped is read on every call. A full ring (the flush thread
 * is behind) goes to the pure _enqueue, which may wait for room.
 * ------------------------------------------------------------------------------------- */

static PyObject *str_stopped, *str_started_count, *str_ended_count,
    *str_open_spans, *str_sinks, *str_ring, *str_capacity, *str_wake_at, *str_wakeup,
    *str_is_set, *str_set, *str_enqueue, *str_store, *str_ended_deque, *str_evictions;

enum { P_STARTED, P_ENDED, P_OPEN, P_SINKS, P_RING, P_WAKEUP, P_STORE, P_ENDED_DEQUE,
       P_EVICTIONS, P_FIELDS };
static PyObject *pc_weak;              /* a weak reference to the processor read, or NULL */
static PyObject *pc_fields[P_FIELDS];  /* what it was made with (owned) */
static Py_ssize_t pc_capacity, pc_wake_at, pc_store_capacity;

static void
forget_processor(void)
{
    Py_CLEAR(pc_weak);
    for (int i = 0; i < P_FIELDS; i++) {
        Py_CLEAR(pc_fields[i]);
    }
}

static PyObject *
processor_gone(PyObject *module, PyObject *weak)
{
    if (weak == pc_weak) {
        forget_processor();
    }
    Py_RETURN_NONE;
}

static PyMethodDef processor_gone_def = {"processor_gone", (PyCFunction)processor_gone, METH_O, NULL};
static PyObject *processor_gone_callback;

/* An int attribute (>= 0), or -1 with an error. */
static Py_ssize_t
size_attribute(PyObject *owner, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(owner, name);
    Py_ssize_t size = value == NULL ? -1 : PyLong_AsSsize_t(value);
    Py_XDECREF(value);
    if (size < 0 && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "a negative size");
    }
    return size;
}

/* pc_fields are ``processor``'s (1), or not (0). Only the pointer is compared: the weak
 * reference's callback forgets them before the processor's memory can be reused. */
static int
kept_for(PyObject *processor)
{
    if (pc_weak == NULL) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *held = NULL;
    if (PyWeakref_GetRef(pc_weak, &held) < 0) {
        PyErr_Clear();
    }
    Py_XDECREF(held);
    return held == processor;
#else
    return PyWeakref_GET_OBJECT(pc_weak) == processor;
#endif
}

/* The processor's fields in pc_fields: 0, or -1 with an error (nothing kept then). */
static int
read_processor(PyObject *processor)
{
    if (kept_for(processor)) {
        return 0;
    }
    forget_processor();
    PyObject *store = PyObject_GetAttr(processor, str_store);
    if (store == NULL) {
        return -1;
    }
    PyObject *fields[P_FIELDS] = {
        PyObject_GetAttr(processor, str_started_count), PyObject_GetAttr(processor, str_ended_count),
        PyObject_GetAttr(processor, str_open_spans), PyObject_GetAttr(processor, str_sinks),
        PyObject_GetAttr(processor, str_ring), PyObject_GetAttr(processor, str_wakeup),
        Py_NewRef(store), PyObject_GetAttr(store, str_ended_deque),
        PyObject_GetAttr(store, str_evictions)};
    Py_DECREF(store);
    Py_ssize_t capacity = size_attribute(processor, str_capacity);
    Py_ssize_t wake_at = capacity < 0 ? -1 : size_attribute(processor, str_wake_at);
    Py_ssize_t store_capacity = wake_at < 0 ? -1 : size_attribute(fields[P_STORE], str_capacity);
    int whole = store_capacity >= 0;
    for (int i = 0; i < P_FIELDS; i++) {
        whole = whole && fields[i] != NULL;
    }
    /* Checked once: a dict of open spans, a list of sinks (read as it is now on each call). */
    if (whole && (!PyDict_Check(fields[P_OPEN]) || !PyList_Check(fields[P_SINKS]))) {
        PyErr_SetString(PyExc_TypeError, "the processor's open spans or sinks are not as made");
        whole = 0;
    }
    PyObject *weak = whole ? PyWeakref_NewRef(processor, processor_gone_callback) : NULL;
    if (weak == NULL) {
        for (int i = 0; i < P_FIELDS; i++) {
            Py_XDECREF(fields[i]);
        }
        return -1;
    }
    pc_weak = weak;
    for (int i = 0; i < P_FIELDS; i++) {
        pc_fields[i] = fields[i];
    }
    pc_capacity = capacity;
    pc_wake_at = wake_at;
    pc_store_capacity = store_capacity;
    return 0;
}

/* next(counter): 0, or -1 with an error. */
static int
count(PyObject *counter)
{
    PyObject *next = PyIter_Next(counter);
    Py_XDECREF(next);
    return next == NULL ? -1 : 0;
}

/* Stopped (1: nothing to do), running (0: its fields in pc_fields), -1 an error. */
static int
stopped(PyObject *processor)
{
    int off = attribute_true(processor, str_stopped);
    return off != 0 ? off : read_processor(processor);
}

/* span._span_id, read as a plain attribute (new reference). */
static PyObject *
span_id_of(PyObject *span)
{
    return span_field(span, SP_SPAN_ID);
}

/* on_start(span, parent_context): 1 done, 0 the pure method's, -1 an error. */
static int
processor_on_start(PyObject *processor, PyObject *span)
{
    if ((PyObject *)Py_TYPE(span) != sh_scope_span) {
        return 0;
    }
    int off = stopped(processor);
    if (off != 0) {
        return off < 0 ? -1 : 1;
    }
    if (count(pc_fields[P_STARTED]) < 0) {
        return -1;
    }
    PyObject *span_id = span_id_of(span);
    int set = span_id == NULL ? -1 : PyDict_SetItem(pc_fields[P_OPEN], span_id, span);
    Py_XDECREF(span_id);
    return set < 0 ? -1 : 1;
}

/* Into the ring, as the pure on_end: appended (and the flush thread woken past wake_at), or
 * the pure _enqueue's when the ring is full. 0, or -1 with an error. */
static int
into_ring(PyObject *processor, PyObject *span)
{
    PyObject *ring = pc_fields[P_RING];
    Py_ssize_t held = PyObject_Length(ring);
    if (held < 0) {
        return -1;
    }
    if (held >= pc_capacity) { /* full: the pure _enqueue, which gives the flush thread a while */
        PyObject *call[3] = {processor, span, Py_True};
        PyObject *queued = PyObject_VectorcallMethod(str_enqueue, call,
                                                     3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_XDECREF(queued);
        return queued == NULL ? -1 : 0;
    }
    PyObject *appended = PyObject_CallMethodOneArg(ring, str_append, span);
    if (appended == NULL) {
        return -1;
    }
    Py_DECREF(appended);
    if (held + 1 < pc_wake_at) {
        return 0;
    }
    /* Once, until the flush thread runs: setting the event takes its lock. */
    PyObject *wakeup = Py_NewRef(pc_fields[P_WAKEUP]); /* (a callback below may forget it) */
    PyObject *is_set = PyObject_CallMethodNoArgs(wakeup, str_is_set);
    int already = is_set == NULL ? -1 : PyObject_IsTrue(is_set);
    PyObject *woken = already == 0 ? PyObject_CallMethodNoArgs(wakeup, str_set) : NULL;
    int result = already < 0 || (already == 0 && woken == NULL) ? -1 : 0;
    Py_DECREF(wakeup);
    Py_XDECREF(is_set);
    Py_XDECREF(woken);
    return result;
}

/* An ended span of cirron's, and its list of events, out of the garbage collector's sight.
 * Nothing an ended span holds refers back to it (its parent, its tracer's state, plain values,
 * events; its parent never refers to it), so no cycle runs through it and freeing it is
 * reference counting's. Tracked, each span the store keeps (its last 10,000) would be walked
 * by every young collection until it reached the oldest generation, and bring the next full
 * collection nearer, which in a torch process walks every object torch made. A span with an
 * attribute still to resolve (GPU time) stays tracked: what resolves it is not ours to know.
 * 0, or -1 with an error. */
static int
untrack_ended(PyObject *span)
{
    PyObject *deferred = span_field(span, SP_DEFERRED);
    if (deferred == NULL) {
        return -1;
    }
    int later = deferred != Py_None;
    Py_DECREF(deferred);
    if (later) {
        return 0;
    }
    PyObject *events = span_field(span, SP_EVENTS);
    if (events == NULL) {
        return -1;
    }
    if (PyList_CheckExact(events)) {
        PyObject_GC_UnTrack(events);
    }
    Py_DECREF(events);
    PyObject_GC_UnTrack(span);
    return 0;
}

/* on_end(span): 1 done, 0 the pure method's, -1 an error. */
static int
processor_on_end(PyObject *processor, PyObject *span)
{
    if ((PyObject *)Py_TYPE(span) != sh_scope_span) {
        return 0;
    }
    int off = stopped(processor);
    if (off != 0) {
        return off < 0 ? -1 : 1;
    }
    if (count(pc_fields[P_ENDED]) < 0) {
        return -1;
    }
    if (PyList_GET_SIZE(pc_fields[P_SINKS]) > 0 && into_ring(processor, span) < 0) {
        return -1;
    }
    if (!kept_for(processor)) {
        /* _enqueue let another thread in, which read another processor: this one again */
        int again = stopped(processor);
        if (again != 0) {
            return again < 0 ? -1 : 1;
        }
    }
    /* Last: while a span is among the store's open spans, the signal path knows it may not
     * have reached the ring yet (see on_end_interrupted). */
    PyObject *span_id = span_id_of(span);
    if (span_id == NULL) {
        return -1;
    }
    PyObject *open = pc_fields[P_OPEN];
    int there = PyDict_Contains(open, span_id);
    int result = there < 0 ? -1 : there ? PyDict_DelItem(open, span_id) : 0;
    Py_DECREF(span_id);
    if (result < 0) {
        return -1;
    }
    PyObject *ended = pc_fields[P_ENDED_DEQUE];
    Py_ssize_t held = PyObject_Length(ended);
    if (held < 0 || (held == pc_store_capacity && count(pc_fields[P_EVICTIONS]) < 0)) {
        return -1;
    }
    PyObject *appended = PyObject_CallMethodOneArg(ended, str_append, span);
    Py_XDECREF(appended);
    return appended == NULL || untrack_ended(span) < 0 ? -1 : 1;
}

static PyObject *batches_next_fast(PyObject *self);

static PyObject *
twin_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    TwinObject *self = (TwinObject *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->which == BATCHES_NEXT) {
        if (kwnames == NULL && nargs == 1) {
            PyObject *item = batches_next_fast(args[0]);
            if (item != NULL || PyErr_Occurred()) {
                return item;
            }
        }
    }
    else if (scopes_configured() && self->which >= PROCESSOR_ON_START) {
        int done = 0;
        if (kwnames == NULL && self->which == PROCESSOR_ON_START && (nargs == 2 || nargs == 3)) {
            done = processor_on_start(args[0], args[1]);
        }
        else if (kwnames == NULL && self->which == PROCESSOR_ON_END && nargs == 2) {
            done = processor_on_end(args[0], args[1]);
        }
        if (done < 0) {
            return NULL;
        }
        if (done) {
            Py_RETURN_NONE;
        }
    }
    else if (scopes_configured()) {
        if (self->which == SCOPE_NEW) {
            PyObject *scope = scope_new_fast(args, nargs, kwnames);
            if (scope != NULL || PyErr_Occurred()) {
                return scope;
            }
        }
        else if (kwnames == NULL && nargs >= 1
                 && PyObject_TypeCheck(args[0], (PyTypeObject *)sc_scope)) {
            if (self->which == SCOPE_ENTER && nargs == 1) {
                PyObject *entered = scope_enter_fast(args[0]);
                if (entered != NULL || PyErr_Occurred()) {
                    return entered;
                }
            }
            else if (self->which == SCOPE_EXIT && nargs == 4) {
                int done = scope_exit_fast(args[0], args[2]);
                if (done < 0) {
                    return NULL;
                }
                if (done) {
                    Py_RETURN_NONE;
                }
            }
        }
    }
    return PyObject_Vectorcall(self->pure, args, nargsf, kwnames);
}

static PyObject *
twin_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    int which;
    PyObject *pure;
    static char *names[] = {"which", "pure", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO", names, &which, &pure)) {
        return NULL;
    }
    if (which < SCOPE_NEW || which > BATCHES_NEXT || !PyCallable_Check(pure)) {
        PyErr_SetString(PyExc_ValueError, "which must be 0 to 5, and pure a callable");
        return NULL;
    }
    TwinObject *self = (TwinObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->which = which;
    self->pure = Py_NewRef(pure);
    self->vectorcall = twin_vectorcall;
    return (PyObject *)self;
}

static int
twin_traverse(TwinObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->pure);
    return 0;
}

static int
twin_clear(TwinObject *self)
{
    Py_CLEAR(self->pure);
    return 0;
}

/* Looked up on a Scope (scope.__enter__): a bound method, as for a function. */
static PyObject *
twin_get(PyObject *self, PyObject *instance, PyObject *owner)
{
    if (instance == NULL || instance == Py_None || ((TwinObject *)self)->which == SCOPE_NEW) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, instance);
}

static PyTypeObject TwinType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cirron.recording._hot.Twin",
    .tp_doc = "Twin(which, pure): the compiled twin of ci.scope (0), Scope.__enter__ (1), "
              "Scope.__exit__ (2), RingBufferSpanProcessor.on_start (3) or on_end (4), or "
              "ci.batches' __next__ (5).",
    .tp_basicsize = sizeof(TwinObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = twin_new,
    .tp_traverse = (traverseproc)twin_traverse,
    .tp_clear = (inquiry)twin_clear,
    .tp_dealloc = gc_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(TwinObject, vectorcall),
    .tp_descr_get = twin_get,
    .tp_getset = pure_getset,
};

/* A copy of the OTel context ``context`` with ``span`` current (new reference). */
static PyObject *
context_with(PyObject *context, PyObject *span)
{
    PyObject *made = PyObject_CallNoArgs(sc_context);
    if (made != NULL
        && (PyDict_Update(made, context) < 0 || PyDict_SetItem(made, sh_span_key, span) < 0)) {
        Py_CLEAR(made);
    }
    return made;
}

/* An open ScopeSpan (1), or anything else (0). */
static int
open_lean(PyObject *span)
{
    if (span == NULL || (PyObject *)Py_TYPE(span) != sh_scope_span) {
        return 0;
    }
    PyObject *end_time = span_field(span, SP_END);
    Py_XDECREF(end_time);
    if (end_time == NULL) {
        PyErr_Clear();
    }
    return end_time == Py_None;
}

/* scopes.open_on(rec, name, attributes, start_ns, parent=None) on its common path: under
 * one of cirron's open lean spans (the current one, ``parent``, or cirron.session at the
 * top level). NULL with no error: the pure twin's. */
static PyObject *
open_on_fast(PyObject *rec, PyObject *name, PyObject *attributes, PyObject *start_ns,
             PyObject *given)
{
    if (PyList_GET_SIZE(sh_open) > 0 || (given != Py_None && !open_lean(given))) {
        return NULL;
    }
    PyObject *previous = NULL, *context = NULL, *parent = NULL, *parent_context = NULL;
    PyObject *lean = NULL, *span = NULL, *made = NULL, *token = NULL, *result = NULL;
    lean = rec_field(rec, REC_LEAN);
    if (lean == NULL || lean == Py_None || PyContextVar_Get(sh_context_var, NULL, &previous) < 0
        || previous == NULL || !PyDict_Check(previous)) {
        goto other;
    }
    context = given == Py_None ? Py_NewRef(previous) : context_with(previous, given);
    if (context == NULL) {
        goto failed;
    }
    PyObject *current = given != Py_None ? given : PyDict_GetItemWithError(context, sh_span_key);
    if (current == NULL || current == Py_None) { /* at the top level: under cirron.session */
        parent = rec_field(rec, REC_SESSION);
        parent_context = rec_field(rec, REC_SESSION_CONTEXT);
    }
    else {
        parent = Py_NewRef(current);
        parent_context = Py_NewRef(context);
    }
    if (parent_context == NULL || !open_lean(parent)) {
        goto other; /* a foreign or ended parent, a provider's root: the SDK's way */
    }
    PyObject *trace_id = span_field(parent, SP_TRACE_ID);
    if (trace_id == NULL) {
        goto other;
    }
    PyObject *fields[7] = {name, trace_id, parent, attributes, lean, parent_context, start_ns};
    span = new_scope_span(fields);
    Py_DECREF(trace_id);
    if (span == NULL || (made = context_with(context, span)) == NULL
        || (token = PyContextVar_Set(sh_context_var, made)) == NULL) {
        goto failed;
    }
    result = PyTuple_Pack(3, span, token, previous);
    goto failed; /* (the common clean-up) */

other:
    PyErr_Clear();
failed:
    Py_XDECREF(previous);
    Py_XDECREF(context);
    Py_XDECREF(parent);
    Py_XDECREF(parent_context);
    Py_XDECREF(lean);
    Py_XDECREF(span);
    Py_XDECREF(made);
    Py_XDECREF(token);
    return result;
}

static PyObject *
open_on(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (scopes_configured() && kwnames == NULL && (nargs == 4 || nargs == 5)) {
        PyObject *opened = open_on_fast(args[0], args[1], args[2], args[3],
                                        nargs == 5 ? args[4] : Py_None);
        if (opened != NULL || PyErr_Occurred()) {
            return opened;
        }
    }
    if (sc_open_on == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cirron's compiled scopes are not configured");
        return NULL;
    }
    return PyObject_Vectorcall(sc_open_on, args, nargs, kwnames);
}

/* _restore(span, opened) when the span is on top of the context (1 done); 0: the pure
 * _restore's (closed out of order); -1 an error. */
static int
restore_on_top(PyObject *span, PyObject *opened)
{
    PyObject *context = NULL;
    if (PyContextVar_Get(sh_context_var, NULL, &context) < 0) {
        return -1;
    }
    PyObject *current = context != NULL && PyDict_Check(context)
                            ? PyDict_GetItemWithError(context, sh_span_key) : NULL;
    Py_XDECREF(context);
    if (current != span) {
        PyErr_Clear();
        return 0;
    }
    if (PyContextVar_Reset(sh_context_var, PyTuple_GET_ITEM(opened, 1)) == 0) {
        return 1;
    }
    if (!PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        return -1;
    }
    PyErr_Clear(); /* another context (a generator moved), or reset twice: never another's */
    PyObject *token = PyContextVar_Set(sh_context_var, PyTuple_GET_ITEM(opened, 2));
    Py_XDECREF(token);
    return token == NULL ? -1 : 1;
}

/* scopes.close_span(opened, None, end_ns) for a 3-tuple ``opened``: 0, or -1 with an error. */
static int
close_opened(PyObject *opened, PyObject *end_ns)
{
    PyObject *span = PyTuple_GET_ITEM(opened, 0);
    Py_INCREF(opened);
    int done = end_scope_span(span, end_ns) < 0 ? -1 : restore_on_top(span, opened);
    if (done == 0) {
        PyObject *restored = PyObject_CallFunctionObjArgs(sc_restore, span, opened, NULL);
        done = restored == NULL ? -1 : 1;
        Py_XDECREF(restored);
    }
    Py_DECREF(opened);
    return done < 0 ? -1 : 0;
}

/* scopes.close_span(opened, error=None, end_ns=None): without an error, here. */
static PyObject *
close_span(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *error = Py_None, *end_ns = Py_None;
    int ours = scopes_configured() && nargs >= 1 && nargs + nkw <= 3;
    for (Py_ssize_t i = 1; ours && i < nargs + nkw; i++) {
        PyObject *keyword = i < nargs ? NULL : PyTuple_GET_ITEM(kwnames, i - nargs);
        if (keyword == NULL ? i == 1 : PyUnicode_CompareWithASCIIString(keyword, "error") == 0) {
            error = args[i];
        }
        else if (keyword == NULL || PyUnicode_CompareWithASCIIString(keyword, "end_ns") == 0) {
            end_ns = args[i];
        }
        else {
            ours = 0;
        }
    }
    PyObject *opened = nargs >= 1 ? args[0] : NULL;
    if (ours && error == Py_None && (end_ns == Py_None || PyLong_CheckExact(end_ns))
        && PyTuple_CheckExact(opened) && PyTuple_GET_SIZE(opened) == 3) {
        if (close_opened(opened, end_ns) < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (sc_close_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cirron's compiled scopes are not configured");
        return NULL;
    }
    return PyObject_Vectorcall(sc_close_span, args, nargsf, kwnames);
}

/* ---------------------------------------------------------------------------------------
 * ci.batches: the next item of a _Batches (cirron.training.loops), compiled. Its common case
 * only, the loop past its first item over anything but a torch DataLoader, on a recorder
 * that records, with the step CPU clock neither due nor running: the previous batch's span
 * ends where the next one's fetch begins, the item is fetched, and its span opens. The rest
 * is the pure __next__'s (configure_batches hands over what the case works with); while a
 * function it does the work of is replaced (a test's monkeypatch, a user's wrapper), the
 * pure one runs, and the replacement with it.
 * ------------------------------------------------------------------------------------- */

static PyObject *bt_type;        /* loops._Batches (exactly: a subclass is the pure's) */
static PyObject *bt_state_type;  /* training_state.TrainingState */
static PyObject *bt_moment_type; /* training_state.Moment */
static PyObject *bt_yield_step;  /* training.yield_step_to_user(state) */
static PyObject *bt_batch_name;  /* semconv.BATCH */
static PyObject *bt_index_key;   /* semconv.INDEX */
static PyObject *bt_one;         /* 1 */
static PyObject *bt_patched;     /* hot.patched */
static PyObject *bt_watched;     /* ((holder, name, what it must be), ...) */
static PyObject *bt_seen;        /* the count when they were last looked at */
static int bt_as_configured;     /* ... and whether each was what it must be then */
static Py_ssize_t at_b_iterator, at_b_index, at_b_open, at_b_moment, at_b_timed;
static Py_ssize_t at_bs_step, at_bs_measured, at_bs_every, at_bm_opened, at_bm_cpu;

/* Whether each function a compiled twin does the work of is still the one it was given:
 * ``watched`` holds (holder, name) pairs, each to be cirron's own (cirrons_own), or (holder,
 * name, value) triples, each to be that very object. Looked at again only when hot.patched
 * (``patched``) counted an attribute set on a watched module or class since ``*seen``. */
static int cirrons_own(PyObject *function);

static int
as_configured(PyObject *patched, PyObject *watched, PyObject **seen, int *same_then)
{
    PyObject *count = PyList_GET_SIZE(patched) > 0 ? PyList_GET_ITEM(patched, 0) : NULL;
    if (count == *seen) {
        return *same_then;
    }
    int same = count != NULL;
    for (Py_ssize_t i = 0; same && i < PyTuple_GET_SIZE(watched); i++) {
        PyObject *entry = PyTuple_GET_ITEM(watched, i);
        PyObject *now = PyObject_GetAttr(PyTuple_GET_ITEM(entry, 0), PyTuple_GET_ITEM(entry, 1));
        same = now != NULL
               && (PyTuple_GET_SIZE(entry) == 3 ? now == PyTuple_GET_ITEM(entry, 2)
                                                : cirrons_own(now));
        Py_XDECREF(now);
    }
    PyErr_Clear();
    Py_XSETREF(*seen, Py_XNewRef(count));
    *same_then = same;
    return same;
}

static int
batches_configured(void)
{
    if (bt_type == NULL || !scopes_configured()) {
        return 0;
    }
    return as_configured(bt_patched, bt_watched, &bt_seen, &bt_as_configured);
}

/* ``value`` (an int slot, borrowed; NULL when not set) as a long long into ``out``: 1, or 0
 * for anything else (not an exact int, out of range). */
static int
exact_long(PyObject *value, long long *out)
{
    if (value == NULL || !PyLong_CheckExact(value)) {
        return 0;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The next item of _Batches ``self`` (a new reference), NULL with an error (the iterator's,
 * StopIteration at its end), or NULL with none: the pure __next__'s (nothing done yet). */
static PyObject *
batches_next_fast(PyObject *self)
{
    if ((PyObject *)Py_TYPE(self) != bt_type || !batches_configured()) {
        return NULL;
    }
    PyObject *iterator = SLOT(self, at_b_iterator), *index = SLOT(self, at_b_index);
    PyObject *moment = SLOT(self, at_b_moment), *open = SLOT(self, at_b_open);
    if (iterator == NULL || iterator == Py_None || index == NULL || !PyLong_CheckExact(index)
        || SLOT(self, at_b_timed) != Py_False || moment == NULL
        || (PyObject *)Py_TYPE(moment) != bt_moment_type
        || (open != NULL && open != Py_None && open != moment)) {
        return NULL;
    }
    int closing = open == moment;
    PyObject *previous = closing ? SLOT(moment, at_bm_opened) : NULL;
    if (closing && (SLOT(moment, at_bm_cpu) != Py_None || previous == NULL
                    || !PyTuple_CheckExact(previous) || PyTuple_GET_SIZE(previous) != 3)) {
        return NULL; /* a measured step ends in Python (resources.step_ends) */
    }
    PyObject *rec = recording(sh_recorder), *state = NULL, *started = NULL;
    PyObject *item = NULL, *attributes = NULL, *opened = NULL, *result = NULL;
    if (rec == NULL) {
        return NULL;
    }
    /* Held: ending a span runs the provider's other processors, which could touch the loop. */
    Py_INCREF(iterator);
    Py_INCREF(index);
    Py_INCREF(moment);
    state = rec_field(rec, REC_TRAINING);
    if (state == NULL || (PyObject *)Py_TYPE(state) != bt_state_type
        || (started = PyObject_CallNoArgs(sh_time_ns)) == NULL) {
        goto other;
    }
    long long start, measured, every;
    if (!exact_long(started, &start) || !exact_long(SLOT(state, at_bs_measured), &measured)
        || !exact_long(SLOT(state, at_bs_every), &every) || measured == 0
        || start - measured < 0 || start - measured >= every) {
        goto other; /* the step CPU clock is due: resources.cpu_mark, in Python */
    }
    /* From here on, what the pure __next__ does, in its order. */
    if (closing) {
        Py_INCREF(previous);
        Py_XSETREF(SLOT(self, at_b_open), Py_NewRef(Py_None));
        if (SLOT(state, at_bs_step) == moment) {
            Py_XSETREF(SLOT(state, at_bs_step), Py_NewRef(Py_None));
        }
        int closed = close_opened(previous, started);
        Py_DECREF(previous);
        if (closed < 0) {
            goto done;
        }
    }
    item = PyIter_Next(iterator);
    if (item == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetNone(PyExc_StopIteration);
        }
        goto done;
    }
    if ((attributes = PyDict_New()) == NULL
        || PyDict_SetItem(attributes, bt_index_key, index) < 0) {
        goto done;
    }
    PyObject *step = SLOT(state, at_bs_step);
    if (step != NULL && step != Py_None) { /* a step another owner left open */
        PyObject *yielded = PyObject_CallOneArg(bt_yield_step, state);
        if (yielded == NULL) {
            goto done;
        }
        Py_DECREF(yielded);
    }
    opened = open_on_fast(rec, bt_batch_name, attributes, started, Py_None);
    if (opened == NULL && !PyErr_Occurred()) {
        PyObject *call[4] = {rec, bt_batch_name, attributes, started};
        opened = PyObject_Vectorcall(sc_open_on, call, 4, NULL);
    }
    if (opened == NULL) {
        goto done;
    }
    PyObject *next_index = PyNumber_Add(index, bt_one);
    if (next_index == NULL) {
        goto done;
    }
    Py_XSETREF(SLOT(moment, at_bm_opened), Py_NewRef(opened));
    Py_XSETREF(SLOT(moment, at_bm_cpu), Py_NewRef(Py_None));
    Py_XSETREF(SLOT(state, at_bs_step), Py_NewRef(moment));
    Py_XSETREF(SLOT(self, at_b_open), Py_NewRef(moment));
    Py_XSETREF(SLOT(self, at_b_index), next_index);
    result = Py_NewRef(item);
    goto done;

other:
    PyErr_Clear();
done:
    Py_DECREF(iterator);
    Py_DECREF(index);
    Py_DECREF(moment);
    Py_DECREF(rec);
    Py_XDECREF(state);
    Py_XDECREF(started);
    Py_XDECREF(item);
    Py_XDECREF(attributes);
    Py_XDECREF(opened);
    return result;
}

static PyObject *
configure_batches(PyObject *module, PyObject *args, PyObject *kwargs)
{
    PyObject *f[9];
    static char *names[] = {"batches", "loop", "state", "moment", "yield_step", "batch_name",
                            "index_key", "patched", "watched", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$O!O!O!O!OUUO!O!", names, &PyType_Type, &f[0],
                                     &PyType_Type, &f[1], &PyType_Type, &f[2], &PyType_Type,
                                     &f[3], &f[4], &f[5], &f[6], &PyList_Type, &f[7],
                                     &PyTuple_Type, &f[8])) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(f[8]); i++) {
        PyObject *entry = PyTuple_GET_ITEM(f[8], i);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3
            || !PyUnicode_Check(PyTuple_GET_ITEM(entry, 1))) {
            PyErr_SetString(PyExc_TypeError, "watched must hold (holder, name, value) triples");
            return NULL;
        }
    }
    Py_ssize_t at[10];
    struct {
        PyObject *type;
        const char *slot;
    } slots[10] = {{f[1], "_iterator"}, {f[1], "_index"}, {f[1], "_open"}, {f[0], "_moment"},
                   {f[0], "_timed"}, {f[2], "step"}, {f[2], "measured_ns"},
                   {f[2], "measure_every_ns"}, {f[3], "opened"}, {f[3], "cpu"}};
    for (int i = 0; i < 10; i++) {
        if ((at[i] = slot_offset(slots[i].type, slots[i].slot)) < 0) {
            return NULL;
        }
    }
    if (bt_one == NULL && (bt_one = PyLong_FromLong(1)) == NULL) {
        return NULL;
    }
    PyObject **kept[9] = {&bt_type, NULL, &bt_state_type, &bt_moment_type, &bt_yield_step,
                          &bt_batch_name, &bt_index_key, &bt_patched, &bt_watched};
    for (int i = 0; i < 9; i++) {
        if (kept[i] != NULL) {
            Py_XSETREF(*kept[i], Py_NewRef(f[i]));
        }
    }
    Py_CLEAR(bt_seen); /* looked at again on the next call */
    Py_ssize_t *offsets[10] = {&at_b_iterator, &at_b_index, &at_b_open, &at_b_moment,
                               &at_b_timed, &at_bs_step, &at_bs_measured, &at_bs_every,
                               &at_bm_opened, &at_bm_cpu};
    for (int i = 0; i < 10; i++) {
        *offsets[i] = at[i];
    }
    Py_RETURN_NONE;
}

static PyObject *
configure_scopes(PyObject *module, PyObject *args, PyObject *kwargs)
{
    PyObject *f[8];
    Py_ssize_t max_depth;
    static char *names[] = {"enclosing", "depth_key", "context", "restore", "scope",
                            "random_bits", "open_on", "close_span", "max_depth", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$O!OO!OO!OOOn", names, &PySet_Type, &f[0],
                                     &f[1], &PyType_Type, &f[2], &f[3], &PyType_Type, &f[4],
                                     &f[5], &f[6], &f[7], &max_depth)) {
        return NULL;
    }
    Py_ssize_t offsets[5];
    const char *slots[5] = {"name", "attributes", "span", "start_ns", "_opened"};
    for (int i = 0; i < 5; i++) {
        offsets[i] = slot_offset(f[4], slots[i]);
        if (offsets[i] < 0) {
            return NULL;
        }
    }
    if (sc_zero == NULL && (sc_zero = PyLong_FromLong(0)) == NULL) {
        return NULL;
    }
    if (sc_sixty_four == NULL && (sc_sixty_four = PyLong_FromLong(64)) == NULL) {
        return NULL;
    }
    if (sc_empty == NULL && (sc_empty = PyTuple_New(0)) == NULL) {
        return NULL;
    }
    PyObject **kept[8] = {&sc_enclosing, &sc_depth_key, &sc_context, &sc_restore, &sc_scope,
                          &sc_random_bits, &sc_open_on, &sc_close_span};
    for (int i = 0; i < 8; i++) {
        Py_XSETREF(*kept[i], Py_NewRef(f[i]));
    }
    sc_max_depth = max_depth;
    at_scope_name = offsets[0];
    at_scope_attributes = offsets[1];
    at_scope_span = offsets[2];
    at_scope_start = offsets[3];
    at_scope_opened = offsets[4];
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------
 * The spool's encoder (cirron.exporters.otlp_json): a span's attributes and its mark events
 * as OTLP/JSON text, compiled. A value of another type than str, float, bool or int, and an
 * event that is not a mark's, go to the pure functions configure_encoder was given; the
 * text is the same either way (tests compare them). The text is written into one buffer of
 * bytes and made a str once: every piece is ASCII (JSON's quoting escapes the rest), and a
 * str a piece would cost allocates more than the span's text takes to write.
 * ------------------------------------------------------------------------------------- */

static PyObject *en_quote;      /* json's encode_basestring_ascii */
static PyObject *en_key_texts;  /* otlp_json._KEY_TEXTS: a key -> its text before the value */
static PyObject *en_key_text;   /* otlp_json._key_text(key): the text, kept while there is room */
static PyObject *en_any_value;  /* otlp_json.any_value(value) */
static PyObject *en_key_values; /* otlp_json.key_values (pure): a mapping that is not a dict */
static PyObject *en_events;     /* otlp_json._events (pure): events that are not all marks' */
static PyObject *en_mark_event; /* MarkEvent */
static PyObject *en_non_finite; /* otlp_json._NON_FINITE: str(value) -> its JSON text */
static PyObject *txt_local_flags; /* otlp_json._LOCAL_FLAGS */
static Py_ssize_t en_at_name, en_at_attributes, en_at_timestamp;

/* Text being written: bytes on the stack until it outgrows them. ``foreign``: a piece was not
 * ASCII (none is, as the pure functions write them): the text is the pure function's. */
typedef struct {
    char *data;
    Py_ssize_t size, room;
    int foreign;
    char local[768];
} Text;

static void
text_start(Text *text)
{
    text->data = text->local;
    text->size = 0;
    text->room = (Py_ssize_t)sizeof(text->local);
    text->foreign = 0;
}

static void
text_drop(Text *text)
{
    if (text->data != text->local) {
        PyMem_Free(text->data);
    }
    text->data = text->local;
}

/* ``count`` bytes at the end: 0, or -1 with an error. */
static int
put(Text *text, const char *bytes, Py_ssize_t count)
{
    if (count > text->room - text->size) {
        Py_ssize_t room = text->room;
        while (count > room - text->size) {
            if (room > PY_SSIZE_T_MAX / 2) {
                PyErr_NoMemory();
                return -1;
            }
            room *= 2;
        }
        char *data = text->data == text->local ? PyMem_Malloc(room)
                                                : PyMem_Realloc(text->data, room);
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (text->data == text->local) {
            memcpy(data, text->local, text->size);
        }
        text->data = data;
        text->room = room;
    }
    memcpy(text->data + text->size, bytes, count);
    text->size += count;
    return 0;
}

#define PUT_LITERAL(text, literal) put((text), (literal), (Py_ssize_t)sizeof(literal) - 1)

/* A str's characters at the end (borrowed): 0, or -1 with an error. */
static int
put_str(Text *text, PyObject *piece)
{
    if (!PyUnicode_Check(piece)) {
        PyErr_SetString(PyExc_TypeError, "a piece of the encoder's text is not a str");
        return -1;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(piece) < 0) {
        return -1;
    }
#endif
    if (!PyUnicode_IS_ASCII(piece)) {
        text->foreign = 1;
        return 0;
    }
    return put(text, (const char *)PyUnicode_DATA(piece), PyUnicode_GET_LENGTH(piece));
}

/* As put_str, for a new reference (or NULL: failed), which it releases. */
static int
put_new(Text *text, PyObject *piece)
{
    if (piece == NULL) {
        return -1;
    }
    int done = put_str(text, piece);
    Py_DECREF(piece);
    return done;
}

/* The decimal digits of ``value`` at the end (as str() writes an int). */
static int
put_decimal(Text *text, long long value)
{
    char digits[24];
    char *digit = digits + sizeof(digits);
    unsigned long long magnitude = value < 0 ? 0ULL - (unsigned long long)value
                                             : (unsigned long long)value;
    do {
        *--digit = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (value < 0) {
        *--digit = '-';
    }
    return put(text, digit, digits + sizeof(digits) - digit);
}

/* An int's decimal text (a time, an int attribute) at the end. */
static int
put_int(Text *text, PyObject *number)
{
    if (PyLong_CheckExact(number)) {
        int overflow = 0;
        long long value = PyLong_AsLongLongAndOverflow(number, &overflow);
        if (value == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (!overflow) {
            return put_decimal(text, value);
        }
    }
    return put_new(text, PyObject_Str(number));
}

/* The text in a new str, the buffer released; NULL with an error, or with none when a piece
 * was foreign (the caller's pure function writes it). */
static PyObject *
text_finish(Text *text)
{
    PyObject *made = NULL;
    if (!text->foreign) {
        made = PyUnicode_New(text->size, 127);
        if (made != NULL) {
            memcpy(PyUnicode_DATA(made), text->data, text->size);
        }
    }
    text_drop(text);
    return made;
}

/* One value's OTLP AnyValue text: 0, or -1 with an error. */
static int
put_any_value(Text *text, PyObject *value)
{
    if (PyUnicode_CheckExact(value)) {
        return PUT_LITERAL(text, "{\"stringValue\":") < 0 ? -1
               : put_new(text, PyObject_CallOneArg(en_quote, value)) < 0 ? -1
               : PUT_LITERAL(text, "}");
    }
    if (PyFloat_CheckExact(value)) {
        double number = PyFloat_AS_DOUBLE(value);
        if (PUT_LITERAL(text, "{\"doubleValue\":") < 0) {
            return -1;
        }
        if (Py_IS_FINITE(number)) {
            if (put_new(text, PyObject_Repr(value)) < 0) {
                return -1;
            }
        }
        else {
            PyObject *name = PyObject_Str(value);
            PyObject *written = name == NULL ? NULL : PyDict_GetItemWithError(en_non_finite, name);
            Py_XDECREF(name);
            if (written == NULL) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_KeyError, "a non-finite double with no text");
                }
                return -1;
            }
            if (put_str(text, written) < 0) {
                return -1;
            }
        }
        return PUT_LITERAL(text, "}");
    }
    if (PyBool_Check(value)) {
        return value == Py_True ? PUT_LITERAL(text, "{\"boolValue\":true}")
                                : PUT_LITERAL(text, "{\"boolValue\":false}");
    }
    if (PyLong_CheckExact(value)) {
        return PUT_LITERAL(text, "{\"intValue\":\"") < 0 ? -1
               : put_int(text, value) < 0                ? -1
               : PUT_LITERAL(text, "\"}");
    }
    return put_new(text, PyObject_CallOneArg(en_any_value, value));
}

/* The KeyValues of the dict ``attributes``, between [ and ]. */
static int
put_key_values(Text *text, PyObject *attributes)
{
    if (PUT_LITERAL(text, "[") < 0) {
        return -1;
    }
    Py_ssize_t position = 0;
    PyObject *key, *value;
    int first = 1;
    while (PyDict_Next(attributes, &position, &key, &value)) {
        Py_INCREF(key);
        Py_INCREF(value);
        PyObject *before = PyDict_GetItemWithError(en_key_texts, key);
        Py_XINCREF(before);
        if (before == NULL && !PyErr_Occurred()) {
            before = PyObject_CallOneArg(en_key_text, key);
        }
        int failed = before == NULL || (!first && PUT_LITERAL(text, ",") < 0)
                     || put_new(text, before) < 0 || put_any_value(text, value) < 0
                     || PUT_LITERAL(text, "}") < 0;
        Py_DECREF(key);
        Py_DECREF(value);
        if (failed) {
            return -1;
        }
        first = 0;
    }
    return PUT_LITERAL(text, "]");
}

/* otlp_json.key_values(attributes): a JSON array of OTLP KeyValues. */
static PyObject *
encoder_key_values(PyObject *module, PyObject *attributes)
{
    if (en_quote == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cirron's compiled encoder is not configured");
        return NULL;
    }
    if (!PyDict_CheckExact(attributes)) { /* None, a mapping of the SDK's: the pure function */
        return PyObject_CallOneArg(en_key_values, attributes);
    }
    Text text;
    text_start(&text);
    if (put_key_values(&text, attributes) < 0) {
        text_drop(&text);
        return NULL;
    }
    PyObject *made = text_finish(&text);
    return made != NULL || PyErr_Occurred() ? made : PyObject_CallOneArg(en_key_values, attributes);
}

/* ',"events":[...]' for ``events`` if they are all marks (1); 0: they are not, nothing
 * written; -1: an error. */
static int
put_events(Text *text, PyObject *events)
{
    PyObject *items = PySequence_Fast(events, "events must be a sequence");
    if (items == NULL) {
        return -1;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *event = PySequence_Fast_GET_ITEM(items, i);
        if ((PyObject *)Py_TYPE(event) != en_mark_event
            || !PyDict_CheckExact(SLOT(event, en_at_attributes) ? SLOT(event, en_at_attributes) : Py_None)
            || SLOT(event, en_at_name) == NULL || SLOT(event, en_at_timestamp) == NULL) {
            Py_DECREF(items); /* an event of the SDK's: the pure function, for them all */
            return 0;
        }
    }
    int failed = PUT_LITERAL(text, ",\"events\":[") < 0;
    for (Py_ssize_t i = 0; !failed && i < count; i++) {
        PyObject *event = PySequence_Fast_GET_ITEM(items, i);
        PyObject *attributes = SLOT(event, en_at_attributes);
        failed = (i > 0 && PUT_LITERAL(text, ",") < 0)
                 || PUT_LITERAL(text, "{\"timeUnixNano\":\"") < 0
                 || put_int(text, SLOT(event, en_at_timestamp)) < 0
                 || PUT_LITERAL(text, "\",\"name\":") < 0
                 || put_new(text, PyObject_CallOneArg(en_quote, SLOT(event, en_at_name))) < 0
                 || PUT_LITERAL(text, ",\"attributes\":") < 0
                 || (PyDict_GET_SIZE(attributes) == 0 ? PUT_LITERAL(text, "[]") < 0
                                                      : put_key_values(text, attributes) < 0)
                 || PUT_LITERAL(text, "}") < 0;
    }
    Py_DECREF(items);
    return failed || PUT_LITERAL(text, "]") < 0 ? -1 : 1;
}

/* otlp_json._events(events): ',"events":[...]' for a span's events. */
static PyObject *
encoder_events(PyObject *module, PyObject *events)
{
    if (en_quote == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cirron's compiled encoder is not configured");
        return NULL;
    }
    Text text;
    text_start(&text);
    int done = put_events(&text, events);
    if (done <= 0) {
        text_drop(&text);
        return done < 0 ? NULL : PyObject_CallOneArg(en_events, events);
    }
    PyObject *made = text_finish(&text);
    return made != NULL || PyErr_Occurred() ? made : PyObject_CallOneArg(en_events, events);
}

/* _Encoder._scope_span(encoder, span): one of cirron's spans as its OTLP/JSON object, on the
 * common path: a span whose parent is none or cirron's, with no links, no status and no events
 * dropped, and an id of 64 bits. Anything else is the pure method's, which writes the same text.
 * What spans of one trace, name or parent share is kept in the encoder's caches, as the pure
 * method keeps it (and its methods make what is not there yet). */
static PyObject *en_scope_span_pure; /* _Encoder._scope_span (pure) */
static PyObject *en_encoder_type;    /* _Encoder: its caches are slots */
static Py_ssize_t en_at_heads, en_at_names, en_at_parents;
static PyObject *str_head_method, *str_name_method, *str_parent_method;

/* cache.get(key) or encoder.method(argument): a new reference, NULL with an error. */
static PyObject *
cached(PyObject *encoder, Py_ssize_t at, PyObject *key, PyObject *method, PyObject *argument)
{
    PyObject *cache = SLOT(encoder, at);
    if (cache == NULL || !PyDict_CheckExact(cache)) {
        PyErr_SetString(PyExc_TypeError, "the encoder's caches are not as made");
        return NULL;
    }
    PyObject *found = PyDict_GetItemWithError(cache, key); /* (texts, never empty) */
    if (found != NULL) {
        return Py_NewRef(found);
    }
    return PyErr_Occurred() ? NULL : PyObject_CallMethodOneArg(encoder, method, argument);
}

/* The text of the common span: 1, 0 (not the common span: the pure method's), -1. */
static int
put_scope_span(Text *text, PyObject *encoder, PyObject *span)
{
    PyObject *links = span_field(span, SP_LINKS), *status = span_field(span, SP_STATUS),
             *dropped = span_field(span, SP_DROPPED_EVENTS), *parent = span_field(span, SP_PARENT),
             *span_id = span_field(span, SP_SPAN_ID);
    int result = -1;
    if (links == NULL || status == NULL || dropped == NULL || parent == NULL || span_id == NULL) {
        goto done;
    }
    int plain = PyObject_IsTrue(links) == 0 && status == sh_unset_status
                && PyObject_IsTrue(dropped) == 0 && PyLong_CheckExact(span_id)
                && (parent == Py_None || (PyObject *)Py_TYPE(parent) == sh_scope_span);
    unsigned long long id = plain ? PyLong_AsUnsignedLongLong(span_id) : 0;
    if (PyErr_Occurred()) {
        PyErr_Clear(); /* not an id of 64 bits, or an error read above: the pure method's */
        plain = 0;
    }
    if (!plain) {
        result = 0;
        goto done;
    }
    PyObject *trace_id = span_field(span, SP_TRACE_ID);
    PyObject *head = trace_id == NULL ? NULL
                     : cached(encoder, en_at_heads, trace_id, str_head_method, span);
    Py_XDECREF(trace_id);
    if (head == NULL) {
        goto done;
    }
    if (!PyTuple_CheckExact(head) || PyTuple_GET_SIZE(head) != 2) {
        PyErr_SetString(PyExc_TypeError, "a trace's head is not as made");
        Py_DECREF(head);
        goto done;
    }
    char hex[16];
    for (int i = 15; i >= 0; i--, id >>= 4) {
        hex[i] = "0123456789abcdef"[id & 15];
    }
    int failed = put_str(text, PyTuple_GET_ITEM(head, 0)) < 0 || put(text, hex, 16) < 0;
    if (!failed && parent == Py_None) {
        failed = PUT_LITERAL(text, "\"") < 0;
    }
    else if (!failed) {
        PyObject *parent_id = span_field(parent, SP_SPAN_ID);
        failed = parent_id == NULL
                 || put_new(text, cached(encoder, en_at_parents, parent_id, str_parent_method,
                                         parent_id)) < 0;
        Py_XDECREF(parent_id);
    }
    failed = failed || put_str(text, PyTuple_GET_ITEM(head, 1)) < 0;
    Py_DECREF(head);
    if (failed) {
        goto done;
    }
    PyObject *name = span_field(span, SP_NAME);
    failed = name == NULL
             || put_new(text, cached(encoder, en_at_names, name, str_name_method, name)) < 0;
    Py_XDECREF(name);
    PyObject *start = failed ? NULL : span_field(span, SP_START);
    failed = start == NULL || put_int(text, start) < 0
             || PUT_LITERAL(text, "\",\"endTimeUnixNano\":\"") < 0;
    Py_XDECREF(start);
    PyObject *end = failed ? NULL : span_field(span, SP_END);
    failed = end == NULL || put_int(text, end) < 0
             || PUT_LITERAL(text, "\",\"attributes\":") < 0;
    Py_XDECREF(end);
    if (failed) {
        goto done;
    }
    PyObject *attributes = span_field(span, SP_ATTRIBUTES);
    int some = attributes == NULL ? -1 : PyObject_IsTrue(attributes);
    if (some < 0) {
        failed = 1;
    }
    else if (!some) {
        failed = PUT_LITERAL(text, "[]") < 0;
    }
    else if (PyDict_CheckExact(attributes)) {
        failed = put_key_values(text, attributes) < 0;
    }
    else { /* a mapping of another kind: the pure function */
        failed = put_new(text, PyObject_CallOneArg(en_key_values, attributes)) < 0;
    }
    Py_XDECREF(attributes);
    failed = failed || put_str(text, txt_local_flags) < 0;
    PyObject *events = failed ? NULL : span_field(span, SP_EVENTS);
    some = events == NULL ? -1 : PyObject_IsTrue(events);
    if (some > 0) { /* marks, written here; another's events, by the pure function */
        int marks = put_events(text, events);
        failed = marks < 0 || (marks == 0 && put_new(text, PyObject_CallOneArg(en_events, events)) < 0);
    }
    failed = failed || some < 0 || PUT_LITERAL(text, "}") < 0;
    Py_XDECREF(events);
    result = failed ? -1 : 1;
done:
    Py_XDECREF(links);
    Py_XDECREF(status);
    Py_XDECREF(dropped);
    Py_XDECREF(parent);
    Py_XDECREF(span_id);
    return result;
}

static PyObject *
encoder_scope_span(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (en_scope_span_pure == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cirron's compiled encoder is not configured");
        return NULL;
    }
    if (nargs != 2 || sh_scope_span == NULL || (PyObject *)Py_TYPE(args[0]) != en_encoder_type
        || (PyObject *)Py_TYPE(args[1]) != sh_scope_span) {
        return PyObject_Vectorcall(en_scope_span_pure, args, nargs, NULL);
    }
    Text text;
    text_start(&text);
    int done = put_scope_span(&text, args[0], args[1]);
    if (done <= 0) {
        text_drop(&text);
        return done < 0 ? NULL : PyObject_Vectorcall(en_scope_span_pure, args, nargs, NULL);
    }
    PyObject *made = text_finish(&text);
    return made != NULL || PyErr_Occurred() ? made
                                             : PyObject_Vectorcall(en_scope_span_pure, args, nargs, NULL);
}

static PyObject *
configure_encoder(PyObject *module, PyObject *args, PyObject *kwargs)
{
    PyObject *f[11];
    static char *names[] = {"quote", "key_texts", "key_text", "any_value", "key_values",
                            "events", "mark_event", "non_finite", "scope_span", "encoder",
                            "local_flags", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OO!OOOOO!O!OO!U", names, &f[0],
                                     &PyDict_Type, &f[1], &f[2], &f[3], &f[4], &f[5],
                                     &PyType_Type, &f[6], &PyDict_Type, &f[7], &f[8],
                                     &PyType_Type, &f[9], &f[10])) {
        return NULL;
    }
    Py_ssize_t at_name = slot_offset(f[6], "_name");
    Py_ssize_t at_attributes = at_name < 0 ? -1 : slot_offset(f[6], "_attributes");
    Py_ssize_t at_timestamp = at_attributes < 0 ? -1 : slot_offset(f[6], "_timestamp");
    Py_ssize_t at_heads = at_timestamp < 0 ? -1 : slot_offset(f[9], "_heads");
    Py_ssize_t at_names = at_heads < 0 ? -1 : slot_offset(f[9], "_names");
    Py_ssize_t at_parents = at_names < 0 ? -1 : slot_offset(f[9], "_parents");
    if (at_parents < 0) {
        return NULL;
    }
    PyObject **kept[11] = {&en_quote, &en_key_texts, &en_key_text, &en_any_value,
                           &en_key_values, &en_events, &en_mark_event, &en_non_finite,
                           &en_scope_span_pure, &en_encoder_type, &txt_local_flags};
    for (int i = 0; i < 11; i++) {
        Py_XSETREF(*kept[i], Py_NewRef(f[i]));
    }
    en_at_name = at_name;
    en_at_attributes = at_attributes;
    en_at_timestamp = at_timestamp;
    en_at_heads = at_heads;
    en_at_names = at_names;
    en_at_parents = at_parents;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------
 * The step cycle of a plain torch loop, compiled: the next batch of the same training loop.
 *
 * Every step of ``for x, y in loader: forward, loss, backward, optimizer.step()`` makes the
 * same moments: the fetch of the next batch (the step before it ends where that fetch
 * begins), the first forward on it (its step begins at the fetch, the fetch's data_load
 * span inside), a backward and an optimizer step inside the open step, and the end of the
 * optimizer step (the step's work is done). cirron.instrumentors.torch_steps.TorchLoop
 * decides what each moment means; here the four hooks do what it would do without a Python
 * frame, when the state is exactly the one the same loop's previous step left. Every test
 * the Python methods make on their way is made first, before anything is done; anything
 * else (an epoch's first batch, an evaluation pass, held forwards, gradient accumulation's
 * micro-batches, a step whose CPU time is measured, a framework's or the user's step, another
 * thread's work, a failure) goes to the pure-Python hook whole. configure_loop hands over
 * what the hooks share; the pure hooks stay the reference (tests compare the traces).
 * ------------------------------------------------------------------------------------- */

/* What configure_loop was given (owned references; NULL until it is called). */
static PyObject *lp_loop;            /* torch_steps.LOOP, a TorchLoop (its fields are slots) */
static PyObject *lp_torch;           /* torch_steps.TORCH, the torch hooks' Owner */
static PyObject *lp_training;        /* torch_steps.TRAINING: a loader pass that trains */
static PyObject *lp_exhausted;       /* torch_steps.EXHAUSTED: a fetch that found it dry */
static PyObject *lp_pass_type, *lp_fetch_type, *lp_moment_type, *lp_state_type;
static PyObject *lp_outer_fetch;     /* torch_data._outer_fetch: [a subclass's fetch runs] */
static PyObject *lp_pass_attribute;  /* torch_data._PASS: an iterator's LoaderPass */
static PyObject *lp_fetch_ends;      /* torch_data._fetch_ends(pass, started, outcome): guarded */
static PyObject *lp_end_step;        /* training.end_step(who, error, end_ns) */
static PyObject *lp_record_on;       /* hook_spans.record_on (an SDK span's data_load) */
static PyObject *lp_position;        /* loop_frames.position(frame, skip) */
static PyObject *lp_users;           /* torch_steps._NOT_THE_USERS: its skip */
static PyObject *lp_last_positions;  /* loop_frames._last: skip -> (code, caller's lasti, answer) */
static PyObject *lp_enclosing;       /* training_state.enclosing */
static PyObject *lp_report;          /* guard.report(site, error) */
static PyObject *lp_site;            /* torch_spans.SITE */
static PyObject *lp_seen_models;     /* torch_modules.seen_models */
static PyObject *lp_backward_running; /* torch_modules.backward_running: [depth, thread] */
static PyObject *lp_grad_enabled;    /* torch_modules.grad_enabled: [torch.is_grad_enabled] */
static PyObject *lp_buckets;         /* torch_comm_hooks.buckets_recorded: [DDP's buckets on] */
static PyObject *lp_forward_failed;  /* torch_modules._forward_failed(hook, error) */
static PyObject *lp_backward_failed; /* torch_modules's guarded _close_backward(hook, error) */
static PyObject *lp_optimizer_spans; /* torch_optim.optimizer_spans: id -> its open hook span */
static PyObject *lp_names;           /* {what: the span name or attribute key} (semconv's) */
static Py_ssize_t lp_max_waiting;    /* torch_steps.MAX_WAITING */
static PyObject *lp_patched;         /* hot.patched: [a count a watched module's setattr bumps] */
static PyObject *lp_watched;         /* ((holder, name), ...): what the cycle does the work of */
static PyObject *lp_seen;            /* the count when they were last looked at */
static int lp_as_configured;         /* ... and whether each was cirron's own then */
static PyObject *str_module, *str_wrapped, *str_cirron_prefix, *str_name;
static PyObject *str_acquire, *str_release, *str_settings, *str_step_sampling;
/* Of lp_names: the names of the spans and attributes the hooks make. */
static PyObject *nm_step, *nm_index, *nm_data_load, *nm_forward, *nm_backward,
    *nm_optimizer_step, *nm_mode, *nm_mode_train, *nm_module, *nm_wrapper, *nm_optimizer;

/* The slots' offsets: TorchLoop, LoaderPass, TrainingState, Moment, Fetch. */
static Py_ssize_t at_loop_held, at_loop_evaluation, at_loop_thread, at_loop_optimizer,
    at_loop_steps, at_loop_passes, at_loop_dry;
static Py_ssize_t at_pass_role, at_pass_batches;
static Py_ssize_t at_st_epoch, at_st_step, at_st_next_step, at_st_detail, at_st_passes,
    at_st_last_step_end, at_st_boundary, at_st_boundary_ns, at_st_measure_every,
    at_st_measured, at_st_holders, at_st_lock;
static Py_ssize_t at_m_owner, at_m_opened, at_m_index, at_m_parent, at_m_complete, at_m_loop,
    at_m_fallback, at_m_steps, at_m_boundary_done, at_m_encloses, at_m_batches, at_m_cpu;
static Py_ssize_t at_f_start, at_f_end, at_f_error, at_f_source;

/* A slot's value (borrowed; NULL when it was never set). */
#define FIELD(object, offset) SLOT(object, offset)
/* A slot set to ``value`` (a new reference it takes). */
#define SET_FIELD(object, offset, value) Py_XSETREF(SLOT(object, offset), (value))

/* ``function`` is cirron's own: defined in one of its modules, and no wrapper of another. */
static int
cirrons_own(PyObject *function)
{
    PyObject *module = PyObject_GetAttr(function, str_module);
    int ours = module != NULL && PyUnicode_Check(module)
               && PyUnicode_Tailmatch(module, str_cirron_prefix, 0, PY_SSIZE_T_MAX, -1) == 1;
    Py_XDECREF(module);
    PyErr_Clear();
    return ours && !PyObject_HasAttr(function, str_wrapped);
}

/* The step cycle may run: it was configured, and each Python function it does the work of
 * is cirron's own (none replaced, by a test's monkeypatch or a user's wrapper: while one
 * is, the pure hooks run, the replacement with them). Looked at again only when
 * hot.patched counted an attribute set on a watched module or class. */
static int
loop_configured(void)
{
    if (lp_loop == NULL || sh_recorder == NULL || hs_build_here == NULL || sc_open_on == NULL) {
        return 0;
    }
    return as_configured(lp_patched, lp_watched, &lp_seen, &lp_as_configured);
}

/* The core guard, inline: an Exception set now is reported for the torch hooks' site and
 * cleared (0: go on); anything else (KeyboardInterrupt) stays set (-1: it propagates). */
static int
guard(void)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return -1;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    PyObject *call[2] = {lp_site, value};
    PyObject *done = PyObject_Vectorcall(lp_report, call, 2, NULL);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (done == NULL) { /* the report failed: counted nowhere, and never raised but a
                         * BaseException (a KeyboardInterrupt meanwhile) */
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(done);
    return 0;
}

/* The user's exception, fetched while a hook was told of it, set again; unless telling it
 * raised a BaseException (a KeyboardInterrupt meanwhile), which propagates instead, as it
 * would from the pure hook (the hooks' functions are guarded: nothing else gets out). */
static void
raise_again(PyObject *type, PyObject *value, PyObject *traceback)
{
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return;
    }
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}

/* ``call(first, the exception set now)`` (an exception instance); the exception stays set
 * (the user's call raised it: it reaches the user unchanged). */
static void
tell_failure(PyObject *call_it, PyObject *first)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL) {
        PyException_SetTraceback(value, traceback);
    }
    PyObject *call[2] = {first, value != NULL ? value : Py_None};
    PyObject *done = PyObject_Vectorcall(call_it, call, 2, NULL);
    Py_XDECREF(done);
    raise_again(type, value, traceback);
}

/* The open training state (recorder.current.training): a new reference, or NULL with no
 * error (no recorder yet: the Python hooks make one). */
static PyObject *
training_state_now(PyObject **rec_out)
{
    PyObject *rec = current_recorder();
    if (rec == NULL || rec == Py_None) {
        Py_XDECREF(rec);
        PyErr_Clear();
        return NULL;
    }
    PyObject *state = rec_field(rec, REC_TRAINING);
    if (state == NULL || (PyObject *)Py_TYPE(state) != lp_state_type) {
        Py_XDECREF(state);
        Py_DECREF(rec);
        PyErr_Clear();
        return NULL;
    }
    if (rec_out != NULL) {
        *rec_out = rec;
    }
    else {
        Py_DECREF(rec);
    }
    return state;
}

/* An int slot's value; 0 with ``*ok`` cleared when it is not one. */
static long long
int_field(PyObject *object, Py_ssize_t offset, int *ok)
{
    PyObject *value = FIELD(object, offset);
    if (value == NULL || !PyLong_CheckExact(value)) {
        *ok = 0;
        return 0;
    }
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
    }
    return number;
}

/* ``list`` is an empty list (the slot holds one). */
static int
empty_list(PyObject *list)
{
    return list != NULL && PyList_CheckExact(list) && PyList_GET_SIZE(list) == 0;
}

/* The thread's id is the loop's training thread, or none is known yet. */
static int
on_training_thread(void)
{
    PyObject *thread = FIELD(lp_loop, at_loop_thread);
    if (thread == NULL) {
        return 0;
    }
    if (thread == Py_None) {
        return 1;
    }
    unsigned long id = PyLong_AsUnsignedLong(thread);
    if (id == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return id == PyThread_get_thread_ident();
}

/* lock.acquire() / lock.release(): 0, or -1 with an error. */
static int
lock_call(PyObject *lock, PyObject *method)
{
    PyObject *done = PyObject_CallMethodNoArgs(lock, method);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* An int slot incremented by one: 0, or -1 with an error. */
static int
increment(PyObject *object, Py_ssize_t offset)
{
    PyObject *value = FIELD(object, offset);
    PyObject *one = PyLong_FromLong(1);
    PyObject *more = value == NULL || one == NULL ? NULL : PyNumber_Add(value, one);
    Py_XDECREF(one);
    if (more == NULL) {
        return -1;
    }
    SET_FIELD(object, offset, more);
    return 0;
}

/* -- the fetch ------------------------------------------------------------------------- */

enum { BEGIN_OTHER = 0, BEGIN_CLOSE, BEGIN_NOTHING };

/* What TorchLoop.fetch_begins does for the next fetch from ``pass``, a training pass past its
 * first batch: close the completed step (BEGIN_CLOSE), or nothing (BEGIN_NOTHING: a step
 * still at work, another owner's); BEGIN_OTHER: the Python method's. */
static int
fetch_begin_kind(PyObject *pass, PyObject *state)
{
    int ok = 1;
    if (FIELD(pass, at_pass_role) != lp_training || !empty_list(FIELD(lp_loop, at_loop_held))
        || FIELD(lp_loop, at_loop_evaluation) != Py_None
        || int_field(pass, at_pass_batches, &ok) <= 0 || !ok) {
        return BEGIN_OTHER;
    }
    PyObject *step = FIELD(state, at_st_step);
    if (step == NULL || (PyObject *)Py_TYPE(step) != lp_moment_type) {
        return BEGIN_OTHER; /* (None: an epoch's first batch is measured from its fetch) */
    }
    if (FIELD(step, at_m_owner) != lp_torch) {
        return BEGIN_NOTHING;
    }
    PyObject *complete = FIELD(step, at_m_complete);
    return complete == Py_True ? BEGIN_CLOSE : complete == Py_False ? BEGIN_NOTHING : BEGIN_OTHER;
}

/* closing.close_step(state, None, end_ns) for a completed step of the torch hooks that is
 * not measured, nor followed by a measured one, and closes nothing else: 1 closed, 0 not
 * that step (nothing done: training.end_step's), -1 an error. */
static int
close_plain_step(PyObject *state, PyObject *step, PyObject *end_ns)
{
    PyObject *epoch = FIELD(state, at_st_epoch), *loop = FIELD(step, at_m_loop);
    PyObject *opened = FIELD(step, at_m_opened);
    if (epoch == NULL || loop == NULL || FIELD(step, at_m_encloses) != Py_False
        || FIELD(step, at_m_cpu) != Py_None || opened == NULL || !PyTuple_CheckExact(opened)
        || PyTuple_GET_SIZE(opened) != 3) {
        return 0;
    }
    if (loop != Py_None && epoch != Py_None
        && ((PyObject *)Py_TYPE(epoch) != lp_moment_type
            || FIELD(epoch, at_m_fallback) != Py_False)) {
        return 0; /* a manual loop's fallback epoch: it ends once the program leaves the loop */
    }
    PyObject *span = PyTuple_GET_ITEM(opened, 0);
    if ((PyObject *)Py_TYPE(span) != sh_scope_span) {
        return 0;
    }
    PyObject *end_time = span_field(span, SP_END);
    PyObject *start_time = end_time == NULL ? NULL : span_field(span, SP_START);
    int ok = end_time == Py_None && start_time != NULL
             && (start_time == Py_None || PyLong_CheckExact(start_time));
    long long started = ok && start_time != Py_None ? PyLong_AsLongLong(start_time) : 0;
    Py_XDECREF(end_time);
    Py_XDECREF(start_time);
    long long end = PyLong_AsLongLong(end_ns);
    long long measured = int_field(state, at_st_measured, &ok);
    long long every = int_field(state, at_st_measure_every, &ok);
    PyObject *now_object = ok ? PyObject_CallNoArgs(sh_time_ns) : NULL;
    long long now = now_object == NULL ? 0 : PyLong_AsLongLong(now_object);
    Py_XDECREF(now_object);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (!ok || !(0 <= now - measured && now - measured < every)) {
        return 0; /* the next step is measured from here: resources.mark(), in Python */
    }
    PyObject *lock = FIELD(state, at_st_lock);
    if (lock == NULL || lock_call(lock, str_acquire) < 0) {
        return lock == NULL ? 0 : -1;
    }
    int result = 0;
    if (FIELD(state, at_st_step) != step) {
        goto done; /* another thread ended it meanwhile: the Python's, which looks again */
    }
    Py_INCREF(step);
    SET_FIELD(state, at_st_step, Py_NewRef(Py_None));
    SET_FIELD(state, at_st_detail, Py_NewRef(Py_True));
    if (PyList_GET_SIZE(sh_completed) >= 2 && PyList_GET_ITEM(sh_completed, 0) == span) {
        if (PyList_SetItem(sh_completed, 0, Py_NewRef(Py_None)) < 0
            || PyList_SetItem(sh_completed, 1, Py_NewRef(Py_None)) < 0) {
            Py_DECREF(step);
            result = -1;
            goto done;
        }
    }
    SET_FIELD(state, at_st_boundary, Py_NewRef(Py_None));
    if (end > now) {
        end = now;
    }
    else if (end < started) {
        end = started;
    }
    PyObject *stamp = PyLong_FromLongLong(end);
    if (stamp == NULL) {
        Py_DECREF(step);
        result = -1;
        goto done;
    }
    SET_FIELD(state, at_st_last_step_end, Py_NewRef(stamp));
    SET_FIELD(state, at_st_boundary_ns, Py_NewRef(stamp));
    result = close_opened(opened, stamp) < 0 ? -1 : 1;
    Py_DECREF(stamp);
    Py_DECREF(step);
done:
    if (lock_call(lock, str_release) < 0) {
        result = -1;
    }
    return result;
}

/* TorchLoop.fetch_ends(pass, started, None) when the batch waits for the work it feeds (the
 * usual next batch): 1 done, 0 the Python method's (nothing done), -1 an error. */
static int
fetch_end_plain(PyObject *pass, PyObject *started)
{
    if (FIELD(pass, at_pass_role) != lp_training || !on_training_thread()
        || pass == FIELD(lp_loop, at_loop_evaluation)
        || PyList_GET_SIZE(sh_pending) + 1 > lp_max_waiting) {
        return 0;
    }
    PyObject *state = training_state_now(NULL);
    if (state == NULL) {
        return 0;
    }
    PyObject *step = FIELD(state, at_st_step);
    int plain = step == Py_None
                || (step != NULL && (PyObject *)Py_TYPE(step) == lp_moment_type
                    && (FIELD(step, at_m_owner) != lp_torch || FIELD(step, at_m_complete) == Py_True));
    Py_DECREF(state);
    if (!plain) {
        return 0; /* another micro-batch of the open step: the Python's */
    }
    PyTypeObject *type = (PyTypeObject *)lp_fetch_type;
    PyObject *now = PyObject_CallNoArgs(sh_time_ns);
    PyObject *fetch = now == NULL ? NULL : type->tp_alloc(type, 0);
    if (fetch == NULL) {
        Py_XDECREF(now);
        return -1;
    }
    SET_FIELD(fetch, at_f_start, Py_NewRef(started));
    SET_FIELD(fetch, at_f_end, now);
    SET_FIELD(fetch, at_f_error, Py_NewRef(Py_None));
    SET_FIELD(fetch, at_f_source, Py_NewRef(pass));
    int result = increment(pass, at_pass_batches) < 0 || PyList_Append(sh_pending, fetch) < 0 ? -1 : 1;
    Py_DECREF(fetch);
    return result;
}

/* -- the work: a forward, a backward, an optimizer step -------------------------------- */

enum { WORK_OTHER = 0, WORK_NONE, WORK_STEP };

/* What TorchLoop.training_work does now: nothing (WORK_NONE: more work in the open step),
 * or begin the step of the one batch waiting, the next of a training pass (WORK_STEP);
 * WORK_OTHER: the Python method's. */
static int
work_kind(PyObject *state)
{
    Py_ssize_t waiting = PyList_GET_SIZE(sh_pending);
    PyObject *step = FIELD(state, at_st_step);
    if (waiting == 0) {
        if (FIELD(lp_loop, at_loop_evaluation) != Py_None || step == NULL
            || (PyObject *)Py_TYPE(step) != lp_moment_type) {
            return WORK_OTHER;
        }
        if (FIELD(step, at_m_owner) == lp_torch && FIELD(step, at_m_complete) != Py_False) {
            PyObject *dry = FIELD(lp_loop, at_loop_dry);
            if (dry != Py_False || empty_list(FIELD(lp_loop, at_loop_passes))) {
                return WORK_OTHER; /* no fetch marks the batch: a new step, in Python */
            }
        }
        return WORK_NONE;
    }
    if (waiting != 1 || step != Py_None || !empty_list(FIELD(lp_loop, at_loop_held))
        || !empty_list(FIELD(state, at_st_passes)) || !empty_list(FIELD(state, at_st_holders))) {
        return WORK_OTHER;
    }
    PyObject *fetch = PyList_GET_ITEM(sh_pending, 0);
    if ((PyObject *)Py_TYPE(fetch) != lp_fetch_type) {
        return WORK_OTHER;
    }
    PyObject *source = FIELD(fetch, at_f_source);
    if (source == NULL || (PyObject *)Py_TYPE(source) != lp_pass_type
        || FIELD(source, at_pass_role) != lp_training || FIELD(fetch, at_f_error) != Py_None) {
        return WORK_OTHER;
    }
    PyObject *epoch = FIELD(state, at_st_epoch);
    if (epoch == NULL || (epoch != Py_None && ((PyObject *)Py_TYPE(epoch) != lp_moment_type
                                               || FIELD(epoch, at_m_owner) != lp_torch))) {
        return WORK_OTHER;
    }
    return WORK_STEP;
}

/* The current span of this thread's OTel context (borrowed; NULL: none, or not a dict). */
static PyObject *
current_here(void)
{
    PyObject *context = NULL;
    if (PyContextVar_Get(sh_context_var, NULL, &context) < 0 || context == NULL
        || !PyDict_Check(context)) {
        Py_XDECREF(context);
        PyErr_Clear();
        return NULL;
    }
    PyObject *span = PyDict_GetItemWithError(context, sh_span_key);
    Py_DECREF(context); /* (the context var holds it, and the context holds the span) */
    PyErr_Clear();
    return span;
}

/* TorchLoop._begin_training_step for the one batch waiting (work_kind's WORK_STEP):
 * training.begin_step(TORCH, fetches=[it]) on its common path, the step under the current
 * span (the epoch) from the fetch's start, its CPU time from where the last step ended.
 * 1 begun, 0 not that path (nothing done: the Python's), -1 an error. */
static int
begin_next_step(PyObject *rec, PyObject *state)
{
    PyObject *fetch = PyList_GET_ITEM(sh_pending, 0);
    int ok = 1;
    long long start = int_field(fetch, at_f_start, &ok);
    long long last = int_field(state, at_st_last_step_end, &ok);
    long long boundary = int_field(state, at_st_boundary_ns, &ok);
    if (start < last) {
        start = last; /* steps never overlap */
    }
    if (!ok || start != boundary || PyList_GET_SIZE(sh_open) > 0) {
        return 0; /* a step not measured from the last one's end: resources.cpu_mark's */
    }
    PyObject *here = current_here();
    if (here == NULL || (PyObject *)Py_TYPE(here) != sh_scope_span) {
        return 0;
    }
    Py_INCREF(here); /* (held while the step opens: the context var moves on) */
    PyObject *end_time = span_field(here, SP_END);
    PyObject *start_time = end_time == NULL ? NULL : span_field(here, SP_START);
    long long here_start = start_time != NULL && PyLong_CheckExact(start_time)
                               ? PyLong_AsLongLong(start_time) : 0;
    ok = end_time == Py_None && start_time != NULL && here_start <= start;
    Py_XDECREF(end_time);
    Py_XDECREF(start_time);
    int enabled = ok ? rec_true(rec, REC_ENABLED) : 0;
    PyObject *settings = enabled > 0 ? rec_field(rec, REC_SETTINGS) : NULL;
    PyObject *sampling = settings == NULL ? NULL : PyObject_GetAttr(settings, str_step_sampling);
    Py_XDECREF(settings);
    Py_XDECREF(sampling);
    if (sampling != Py_None) {
        PyErr_Clear();
        Py_DECREF(here);
        return 0; /* off, or steps sampled: the Python's */
    }
    /* The common path: from here on, what begin_step does. */
    unsigned long thread = PyThread_get_thread_ident();
    PyObject *known = FIELD(lp_loop, at_loop_thread);
    if (known == NULL || known == Py_None || PyLong_AsUnsignedLong(known) != thread) {
        PyErr_Clear();
        PyObject *id = PyLong_FromUnsignedLong(thread);
        if (id == NULL) {
            Py_DECREF(here);
            return -1;
        }
        SET_FIELD(lp_loop, at_loop_thread, id);
    }
    Py_INCREF(fetch);
    if (PyList_SetSlice(sh_pending, 0, 1, NULL) < 0) { /* training.take_fetches() */
        Py_DECREF(fetch);
        Py_DECREF(here);
        return -1;
    }
    PyObject *lock = FIELD(state, at_st_lock);
    if (lock == NULL || lock_call(lock, str_acquire) < 0) {
        Py_DECREF(fetch);
        Py_DECREF(here);
        if (lock == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "the training state has no lock");
        }
        return -1;
    }
    int result = -1;
    PyObject *index = NULL, *next = NULL, *attributes = NULL, *start_ns = NULL, *opened = NULL;
    PyObject *moment = NULL, *one = PyLong_FromLong(1);
    index = Py_XNewRef(FIELD(state, at_st_next_step));
    if (one == NULL || index == NULL || (next = PyNumber_Add(index, one)) == NULL) {
        goto done;
    }
    SET_FIELD(state, at_st_next_step, next);
    attributes = PyDict_New();
    start_ns = PyLong_FromLongLong(start);
    if (attributes == NULL || start_ns == NULL
        || PyDict_SetItem(attributes, nm_index, index) < 0) {
        goto done;
    }
    PyObject *call[4] = {rec, nm_step, attributes, start_ns};
    opened = open_on(NULL, call, 4, NULL);
    if (opened == NULL) {
        goto done;
    }
    PyTypeObject *type = (PyTypeObject *)lp_moment_type;
    moment = type->tp_alloc(type, 0);
    if (moment == NULL) {
        goto done;
    }
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        goto done;
    }
    PyObject *cpu = FIELD(state, at_st_boundary);
    SET_FIELD(moment, at_m_owner, Py_NewRef(lp_torch));
    SET_FIELD(moment, at_m_opened, Py_NewRef(opened));
    SET_FIELD(moment, at_m_index, Py_NewRef(index));
    SET_FIELD(moment, at_m_parent, Py_NewRef(here));
    SET_FIELD(moment, at_m_complete, Py_NewRef(Py_False));
    SET_FIELD(moment, at_m_loop, Py_NewRef(Py_None));
    SET_FIELD(moment, at_m_fallback, Py_NewRef(Py_False));
    SET_FIELD(moment, at_m_steps, Py_NewRef(zero));
    SET_FIELD(moment, at_m_boundary_done, Py_NewRef(Py_False));
    SET_FIELD(moment, at_m_encloses, Py_NewRef(Py_False));
    SET_FIELD(moment, at_m_batches, zero);
    SET_FIELD(moment, at_m_cpu, Py_NewRef(cpu != NULL ? cpu : Py_None));
    if (cpu != NULL && cpu != Py_None) { /* measured from where the last step ended */
        SET_FIELD(state, at_st_measured, Py_XNewRef(FIELD(state, at_st_boundary_ns)));
    }
    SET_FIELD(state, at_st_step, Py_NewRef(moment));
    PyObject *epoch = FIELD(state, at_st_epoch);
    if (epoch != NULL && epoch != Py_None && increment(epoch, at_m_steps) < 0) {
        goto done;
    }
    PyObject *epoch_opened = epoch != NULL && epoch != Py_None ? FIELD(epoch, at_m_opened) : NULL;
    PyObject *epoch_span = epoch_opened != NULL && PyTuple_Check(epoch_opened)
                               && PyTuple_GET_SIZE(epoch_opened) > 0
                               ? PyTuple_GET_ITEM(epoch_opened, 0) : NULL;
    if (here != epoch_span) { /* a user's scope around a manual loop */
        if (PySet_Add(lp_enclosing, here) < 0) {
            goto done;
        }
        SET_FIELD(moment, at_m_encloses, Py_NewRef(Py_True));
    }
    /* training.record_fetches([fetch], step span): its data_load span, inside */
    PyObject *span = PyTuple_CheckExact(opened) && PyTuple_GET_SIZE(opened) == 3
                         ? PyTuple_GET_ITEM(opened, 0) : NULL;
    PyObject *lean = rec_field(rec, REC_LEAN);
    if (lean == NULL) {
        goto done;
    }
    PyObject *no_attributes = PyDict_New();
    if (no_attributes == NULL) {
        Py_DECREF(lean);
        goto done;
    }
    if (span != NULL && (PyObject *)Py_TYPE(span) == sh_scope_span && lean != Py_None) {
        PyObject *fields[7] = {nm_data_load, span, no_attributes, Py_None,
                               FIELD(fetch, at_f_start), FIELD(fetch, at_f_end), Py_None};
        result = finished_impl(fields) < 0 ? -1 : 1;
    }
    else { /* an SDK span (a custom sampler): hook_spans.record_on, in Python */
        PyObject *args[6] = {span != NULL ? span : Py_None, nm_data_load, no_attributes,
                             FIELD(fetch, at_f_start), FIELD(fetch, at_f_end), Py_None};
        PyObject *done = PyObject_Vectorcall(lp_record_on, args, 6, NULL);
        result = done == NULL ? -1 : 1;
        Py_XDECREF(done);
    }
    Py_DECREF(lean);
    Py_DECREF(no_attributes);
done:
    Py_XDECREF(one);
    Py_XDECREF(index);
    Py_XDECREF(attributes);
    Py_XDECREF(start_ns);
    Py_XDECREF(opened);
    Py_XDECREF(moment);
    Py_DECREF(fetch);
    Py_DECREF(here);
    if (lock_call(lock, str_release) < 0) {
        result = -1;
    }
    return result;
}

/* The training work a hook reports, on its common path (work_kind): 1 done, 0 the Python
 * hook's (nothing done), -1 an error (the guard's). */
static int
training_work_plain(void)
{
    PyObject *rec = NULL;
    PyObject *state = training_state_now(&rec);
    if (state == NULL) {
        return 0;
    }
    int kind = work_kind(state);
    int result = kind == WORK_NONE ? 1 : kind == WORK_STEP ? begin_next_step(rec, state) : 0;
    Py_DECREF(state);
    Py_DECREF(rec);
    return result;
}

/* The arguments of a torch module's call, their names and kinds, for begin_impl's span. */
static PyObject *
forward_attributes(PyObject *entry)
{
    PyObject *attributes = PyDict_New();
    if (attributes == NULL || PyDict_SetItem(attributes, nm_mode, nm_mode_train) < 0
        || PyDict_SetItem(attributes, nm_module, PyTuple_GET_ITEM(entry, 1)) < 0
        || (PyTuple_GET_ITEM(entry, 2) != Py_None
            && PyDict_SetItem(attributes, nm_wrapper, PyTuple_GET_ITEM(entry, 2)) < 0)) {
        Py_XDECREF(attributes);
        return NULL;
    }
    return attributes;
}

/* A model's outermost call in train mode with gradients on, as torch_modules._forward_call
 * makes it (NULL with no error: not that call, the Python's): the loop told, a forward span
 * around the call. */
static PyObject *
forward_fast(ModuleCall *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->plain == NULL || !loop_configured()) {
        return NULL;
    }
    PyObject *module = args[0];
    PyObject *key = PyLong_FromVoidPtr(module);
    PyObject *entry = key == NULL ? NULL : PyDict_GetItemWithError(lp_seen_models, key);
    Py_XDECREF(key);
    PyObject *running = PyList_GET_SIZE(lp_backward_running) > 0
                            ? PyList_GET_ITEM(lp_backward_running, 0) : NULL;
    PyObject *is_grad = PyList_GET_SIZE(lp_grad_enabled) > 0
                            ? PyList_GET_ITEM(lp_grad_enabled, 0) : NULL;
    if (entry == NULL || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3
        || running == NULL || PyObject_IsTrue(running) != 0 || is_grad == NULL
        || is_grad == Py_None) {
        PyErr_Clear(); /* a model not seen yet, activation checkpointing's recomputation */
        return NULL;
    }
    PyObject *training = PyObject_GenericGetAttr(module, str_training);
    Py_XDECREF(training);
    PyObject *grad = training == Py_True ? PyObject_CallNoArgs(is_grad) : NULL;
    Py_XDECREF(grad);
    if (grad != Py_True) {
        PyErr_Clear();
        return NULL; /* eval mode, or no gradients: TorchLoop.evaluation_work's */
    }
    Py_INCREF(entry);
    PyObject *hook = NULL;
    int work = training_work_plain();
    if (work == 0) {
        Py_DECREF(entry);
        return NULL;
    }
    if (work > 0) {
        PyObject *attributes = forward_attributes(entry);
        hook = attributes == NULL ? NULL : begin_impl(nm_forward, attributes, 1);
        Py_XDECREF(attributes);
    }
    Py_DECREF(entry);
    if (hook == NULL) {
        if (guard() < 0) {
            return NULL;
        }
        hook = Py_NewRef(Py_None); /* the guard caught it: the call runs, with no span */
    }
    inside_forward = 1;
    PyObject *result = inner_call(self, args, nargs, kwnames);
    inside_forward = 0;
    if (result == NULL) {
        if (hook != Py_None) {
            tell_failure(lp_forward_failed, hook);
        }
        Py_DECREF(hook);
        return NULL;
    }
    if (hook != Py_None) {
        PyObject *ended = hook_end(NULL, &hook, 1, NULL);
        if (ended == NULL && guard() < 0) {
            Py_DECREF(result);
            result = NULL;
        }
        Py_XDECREF(ended);
    }
    Py_DECREF(hook);
    return result;
}

/* -- the hook objects: the fetch, the backward, the optimizer's pre and post hooks ------ */

enum { FETCH_NEXT, BACKWARD, OPTIMIZER_PRE, OPTIMIZER_POST };

typedef struct {
    PyObject_HEAD
    PyObject *pure;     /* the pure-Python hook (first: PureHead), which runs anything else */
    PyObject *original; /* what it wraps (torch's __next__, torch.autograd.backward), or None */
    int which;
    vectorcallfunc vectorcall;
} LoopHookObject;
_Static_assert(offsetof(LoopHookObject, pure) == offsetof(PureHead, pure),
               "LoopHook starts as PureHead");

/* _BaseDataLoaderIter.__next__ (torch_data.make_next's): NULL with no error: the pure one's. */
static PyObject *
fetch_next(LoopHookObject *self, PyObject *iterator)
{
    PyObject *depth = PyList_GET_SIZE(lp_outer_fetch) > 0 ? PyList_GET_ITEM(lp_outer_fetch, 0) : NULL;
    if (depth == NULL || PyObject_IsTrue(depth) != 0) {
        PyErr_Clear();
        return NULL; /* inside a subclass's own iterator: timed there */
    }
    PyObject *pass = PyObject_GenericGetAttr(iterator, lp_pass_attribute);
    if (pass == NULL || (PyObject *)Py_TYPE(pass) != lp_pass_type) {
        Py_XDECREF(pass);
        PyErr_Clear();
        return NULL; /* a pass's first fetch */
    }
    PyObject *state = training_state_now(NULL);
    int begin = state == NULL ? BEGIN_OTHER : fetch_begin_kind(pass, state);
    PyObject *started = begin == BEGIN_OTHER ? NULL : PyObject_CallNoArgs(sh_time_ns);
    if (started == NULL) {
        Py_XDECREF(state);
        Py_DECREF(pass);
        PyErr_Clear();
        return NULL;
    }
    if (begin == BEGIN_CLOSE) { /* training.end_step(TORCH, end_ns=started) */
        PyObject *step = Py_NewRef(FIELD(state, at_st_step));
        int closed = close_plain_step(state, step, started);
        Py_DECREF(step);
        if (closed == 0) {
            PyObject *call[3] = {lp_torch, Py_None, started};
            PyObject *done = PyObject_Vectorcall(lp_end_step, call, 3, NULL);
            closed = done == NULL ? -1 : 1;
            Py_XDECREF(done);
        }
        if (closed < 0 && guard() < 0) {
            Py_DECREF(state);
            Py_DECREF(pass);
            Py_DECREF(started);
            return NULL;
        }
    }
    Py_DECREF(state);
    PyObject *item = PyObject_CallOneArg(self->original, iterator);
    if (item == NULL) { /* dry, or it raised: TorchLoop.fetch_ends, in Python */
        if (PyErr_ExceptionMatches(PyExc_StopIteration)) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyObject *call[3] = {pass, started, lp_exhausted};
            PyObject *done = PyObject_Vectorcall(lp_fetch_ends, call, 3, NULL);
            Py_XDECREF(done);
            raise_again(type, value, traceback);
        }
        else if (PyErr_ExceptionMatches(PyExc_Exception)) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            if (traceback != NULL && value != NULL) {
                PyException_SetTraceback(value, traceback);
            }
            PyObject *call[3] = {pass, started, value != NULL ? value : Py_None};
            PyObject *done = PyObject_Vectorcall(lp_fetch_ends, call, 3, NULL);
            Py_XDECREF(done);
            raise_again(type, value, traceback);
        }
        Py_DECREF(pass);
        Py_DECREF(started);
        return NULL;
    }
    int ended = fetch_end_plain(pass, started);
    if (ended == 0) {
        PyObject *call[3] = {pass, started, Py_None};
        PyObject *done = PyObject_Vectorcall(lp_fetch_ends, call, 3, NULL);
        ended = done == NULL ? -1 : 1;
        Py_XDECREF(done);
    }
    Py_DECREF(pass);
    Py_DECREF(started);
    if (ended < 0 && guard() < 0) {
        Py_DECREF(item);
        return NULL;
    }
    return item;
}

/* torch.autograd.backward (torch_modules.make_backward's) inside the open step, which an
 * optimizer step ends: NULL with no error: the pure one's. */
static PyObject *
backward_fast(LoopHookObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *buckets = PyList_GET_SIZE(lp_buckets) > 0 ? PyList_GET_ITEM(lp_buckets, 0) : NULL;
    if (buckets == NULL || PyObject_IsTrue(buckets) != 0
        || FIELD(lp_loop, at_loop_optimizer) != Py_True) {
        PyErr_Clear();
        return NULL; /* DDP's buckets inside, or a loop whose backward ends its step */
    }
    int work = training_work_plain();
    if (work == 0) {
        return NULL;
    }
    PyObject *hook = NULL; /* (work < 0: an error is set, for the guard below) */
    if (work > 0) {
        PyObject *attributes = PyDict_New();
        hook = attributes == NULL ? NULL : begin_impl(nm_backward, attributes, 1);
        Py_XDECREF(attributes);
    }
    if (hook == NULL) {
        if (guard() < 0) {
            return NULL;
        }
        hook = Py_NewRef(Py_None);
    }
    /* backward_running: [depth, thread], as the pure hook sets it */
    PyObject *depth = PyList_GET_ITEM(lp_backward_running, 0);
    PyObject *one = PyLong_FromLong(1);
    PyObject *deeper = one == NULL ? NULL : PyNumber_Add(depth, one);
    PyObject *thread = deeper == NULL ? NULL : PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (thread == NULL) {
        Py_XDECREF(one);
        Py_XDECREF(deeper);
        Py_DECREF(hook);
        return NULL;
    }
    if (PyList_SetItem(lp_backward_running, 0, deeper) < 0
        || PyList_SetItem(lp_backward_running, 1, thread) < 0) { /* (each steals its item) */
        Py_DECREF(one);
        Py_DECREF(hook);
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback); /* (kept while the depth goes back down) */
    depth = PyList_GET_ITEM(lp_backward_running, 0);
    PyObject *back = PyNumber_Subtract(depth, one);
    Py_DECREF(one);
    if (back == NULL || PyList_SetItem(lp_backward_running, 0, back) < 0) {
        PyErr_Clear();
    }
    PyErr_Restore(type, value, traceback);
    if (result == NULL) {
        tell_failure(lp_backward_failed, hook);
        Py_DECREF(hook);
        return NULL;
    }
    if (hook != Py_None) {
        PyObject *ended = hook_end(NULL, &hook, 1, NULL);
        if (ended == NULL && guard() < 0) {
            Py_DECREF(result);
            result = NULL;
        }
        Py_XDECREF(ended);
    }
    Py_DECREF(hook);
    return result;
}

/* torch_optim.before_optimizer_step(optimizer, args, kwargs) for optimizer.step() with no
 * closure, inside the open step: 1 done, 0 the pure hook's (nothing done), -1 an error. */
static int
optimizer_pre_fast(PyObject *optimizer, PyObject *args, PyObject *kwargs)
{
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 1 || !PyDict_Check(kwargs)
        || PyDict_GET_SIZE(kwargs) != 0 || FIELD(lp_loop, at_loop_optimizer) != Py_True) {
        return 0;
    }
    PyObject *key = PyLong_FromVoidPtr(optimizer);
    if (key == NULL) {
        return -1;
    }
    int stale = PyDict_Contains(lp_optimizer_spans, key);
    if (stale != 0) { /* the last step() raised, and was caught: the pure hook ends its span */
        Py_DECREF(key);
        return stale < 0 ? -1 : 0;
    }
    PyObject *rec = NULL;
    PyObject *state = training_state_now(&rec);
    int kind = state == NULL ? WORK_OTHER : work_kind(state);
    Py_XDECREF(state);
    Py_XDECREF(rec);
    if (kind != WORK_NONE) {
        Py_DECREF(key);
        return 0;
    }
    int result = -1;
    PyObject *attributes = NULL, *name = NULL, *hook = NULL;
    if (increment(lp_loop, at_loop_steps) < 0) { /* TorchLoop.optimizer_stepping */
        goto done;
    }
    name = PyObject_GetAttr((PyObject *)Py_TYPE(optimizer), str_name);
    attributes = name == NULL ? NULL : PyDict_New();
    if (attributes == NULL || PyDict_SetItem(attributes, nm_optimizer, name) < 0) {
        goto done;
    }
    hook = begin_impl(nm_optimizer_step, attributes, 1);
    if (hook == NULL) {
        goto done;
    }
    result = hook == Py_None || PyDict_SetItem(lp_optimizer_spans, key, hook) == 0 ? 1 : -1;
done:
    Py_DECREF(key);
    Py_XDECREF(name);
    Py_XDECREF(attributes);
    Py_XDECREF(hook);
    return result;
}

/* loop_frames.position(frame, users) when this step ends where the last one did (the same
 * code called from the same point of the same frame): its last answer, as position's own
 * first test gives it (a new reference); NULL with no error: position's, in Python. */
static PyObject *
position_again(PyFrameObject *frame)
{
#if PY_VERSION_HEX < 0x030B0000
    return NULL; /* (no PyFrame_GetLasti before 3.11: position's own test, in Python) */
#else
    PyObject *last = PyDict_GetItemWithError(lp_last_positions, lp_users);
    if (last == NULL || !PyTuple_CheckExact(last) || PyTuple_GET_SIZE(last) != 3) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *found = PyTuple_GET_ITEM(last, 2);
    if (!PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 4) {
        return NULL;
    }
    PyCodeObject *code = PyFrame_GetCode(frame);
    int same = (PyObject *)code == PyTuple_GET_ITEM(last, 0);
    Py_DECREF(code);
    PyFrameObject *caller = same ? PyFrame_GetBack(frame) : NULL;
    if (caller == NULL) {
        return NULL;
    }
    PyCodeObject *caller_code = PyFrame_GetCode(caller);
    same = PyLong_AsVoidPtr(PyTuple_GET_ITEM(found, 0)) == (void *)caller
           && (PyObject *)caller_code == PyTuple_GET_ITEM(found, 1)
           && PyLong_AsLong(PyTuple_GET_ITEM(last, 1)) == PyFrame_GetLasti(caller);
    Py_DECREF(caller_code);
    Py_DECREF(caller);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    return same ? Py_NewRef(found) : NULL;
#endif
}

/* torch_optim.after_optimizer_step(optimizer, args, kwargs), whole: its span ends, and the
 * open step of the torch hooks has done its work (TorchLoop.optimizer_stepped, from the
 * frame that called the hook: torch's wrapper around the user's step()). 0, or -1. */
static int
optimizer_post(PyObject *optimizer)
{
    PyObject *key = PyLong_FromVoidPtr(optimizer);
    if (key == NULL) {
        return -1;
    }
    PyObject *hook = PyDict_GetItemWithError(lp_optimizer_spans, key);
    Py_XINCREF(hook);
    int result = hook == NULL ? (PyErr_Occurred() ? -1 : 0) : PyDict_DelItem(lp_optimizer_spans, key);
    Py_DECREF(key);
    if (hook != NULL && result == 0) {
        PyObject *ended = hook_end(NULL, &hook, 1, NULL);
        result = ended == NULL ? -1 : 0;
        Py_XDECREF(ended);
    }
    Py_XDECREF(hook);
    if (result < 0) {
        return -1;
    }
    PyObject *state = training_state_now(NULL);
    if (state == NULL) {
        return 0;
    }
    PyObject *step = FIELD(state, at_st_step);
    if (step == NULL || (PyObject *)Py_TYPE(step) != lp_moment_type
        || FIELD(step, at_m_owner) != lp_torch) {
        Py_DECREF(state);
        return 0;
    }
    PyFrameObject *frame = PyEval_GetFrame();
    PyObject *loop = frame == NULL ? NULL : position_again(frame);
    if (loop == NULL && !PyErr_Occurred()) {
        PyObject *call[2] = {frame != NULL ? (PyObject *)frame : Py_None, lp_users};
        loop = PyObject_Vectorcall(lp_position, call, 2, NULL);
    }
    if (loop == NULL) {
        Py_DECREF(state);
        return -1;
    }
    step = FIELD(state, at_st_step); /* training.complete_step(TORCH, loop): read again */
    if (step != NULL && (PyObject *)Py_TYPE(step) == lp_moment_type
        && FIELD(step, at_m_owner) == lp_torch) {
        SET_FIELD(step, at_m_complete, Py_NewRef(Py_True));
        SET_FIELD(step, at_m_loop, Py_NewRef(loop));
        PyObject *opened = FIELD(step, at_m_opened);
        if (loop != Py_None && opened != NULL && PyTuple_Check(opened)
            && PyTuple_GET_SIZE(opened) > 0 && PyList_GET_SIZE(sh_completed) >= 2) {
            if (PyList_SetItem(sh_completed, 0, Py_NewRef(PyTuple_GET_ITEM(opened, 0))) < 0
                || PyList_SetItem(sh_completed, 1, Py_NewRef(loop)) < 0) {
                result = -1;
            }
        }
    }
    Py_DECREF(loop);
    Py_DECREF(state);
    return result;
}

static PyObject *
loop_hook_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    LoopHookObject *self = (LoopHookObject *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (loop_configured()) {
        if (self->which == FETCH_NEXT && nargs == 1 && kwnames == NULL) {
            PyObject *item = fetch_next(self, args[0]);
            if (item != NULL || PyErr_Occurred()) {
                return item;
            }
        }
        else if (self->which == BACKWARD) {
            PyObject *result = backward_fast(self, args, nargsf, kwnames);
            if (result != NULL || PyErr_Occurred()) {
                return result;
            }
        }
        else if (self->which >= OPTIMIZER_PRE && nargs == 3 && kwnames == NULL) {
            int done = self->which == OPTIMIZER_PRE ? optimizer_pre_fast(args[0], args[1], args[2])
                                                    : (optimizer_post(args[0]) < 0 ? -1 : 1);
            if (done < 0 && guard() < 0) {
                return NULL;
            }
            if (done != 0) { /* (done, or the guard caught a failure: as the pure hook does) */
                Py_RETURN_NONE;
            }
        }
    }
    return PyObject_Vectorcall(self->pure, args, nargsf, kwnames);
}

static PyObject *
loop_hook_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    int which;
    PyObject *original, *pure;
    static char *names[] = {"which", "original", "pure", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOO", names, &which, &original, &pure)) {
        return NULL;
    }
    if (which < FETCH_NEXT || which > OPTIMIZER_POST || !PyCallable_Check(pure)
        || (which <= BACKWARD && !PyCallable_Check(original))) {
        PyErr_SetString(PyExc_ValueError,
                        "which must be 0 to 3, pure a callable, and original one for 0 and 1");
        return NULL;
    }
    LoopHookObject *self = (LoopHookObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->which = which;
    self->pure = Py_NewRef(pure);
    self->original = Py_NewRef(original);
    self->vectorcall = loop_hook_vectorcall;
    return (PyObject *)self;
}

static int
loop_hook_traverse(LoopHookObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->pure);
    Py_VISIT(self->original);
    return 0;
}

static int
loop_hook_clear(LoopHookObject *self)
{
    Py_CLEAR(self->pure);
    Py_CLEAR(self->original);
    return 0;
}

/* Looked up on an iterator (iterator.__next__): a bound method, as for a function. */
static PyObject *
loop_hook_get(PyObject *self, PyObject *instance, PyObject *owner)
{
    if (instance == NULL || instance == Py_None || ((LoopHookObject *)self)->which != FETCH_NEXT) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, instance);
}

/* What the pure hook wraps (torch's own function), as the pure hook's __wrapped__ says. */
static PyObject *
loop_hook_wrapped(LoopHookObject *self, void *closure)
{
    if (self->original == Py_None) {
        return pure_attribute((PureHead *)self, "__wrapped__");
    }
    return Py_NewRef(self->original);
}

static PyGetSetDef loop_hook_getset[] = {
    {"__wrapped__", (getter)loop_hook_wrapped, NULL, "what the hook wraps", NULL},
    {"__name__", (getter)pure_attribute, NULL, NULL, "__name__"},
    {"__qualname__", (getter)pure_attribute, NULL, NULL, "__qualname__"},
    {"__module__", (getter)pure_attribute, NULL, NULL, "__module__"},
    {"__doc__", (getter)pure_attribute, NULL, NULL, "__doc__"},
    {"pure", (getter)pure_wrapped, NULL, "the pure-Python hook", NULL},
    {NULL},
};

static PyTypeObject LoopHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cirron.recording._hot.LoopHook",
    .tp_doc = "LoopHook(which, original, pure): a torch hook of the step cycle, compiled: "
              "_BaseDataLoaderIter.__next__ (0), torch.autograd.backward (1), the optimizer "
              "step's pre (2) and post (3) hooks; pure runs all but the common path.",
    .tp_basicsize = sizeof(LoopHookObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = loop_hook_new,
    .tp_traverse = (traverseproc)loop_hook_traverse,
    .tp_clear = (inquiry)loop_hook_clear,
    .tp_dealloc = gc_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(LoopHookObject, vectorcall),
    .tp_descr_get = loop_hook_get,
    .tp_getset = loop_hook_getset,
};

/* configure_loop(parts): what the step cycle works with, by name (see the names below). */
static PyObject *
configure_loop(PyObject *module, PyObject *parts)
{
    if (!PyDict_Check(parts)) {
        PyErr_SetString(PyExc_TypeError, "configure_loop() takes a dict of its parts");
        return NULL;
    }
    struct {
        const char *name;
        PyObject **kept;
    } wanted[] = {
        {"loop", &lp_loop}, {"torch", &lp_torch}, {"training", &lp_training},
        {"exhausted", &lp_exhausted}, {"loader_pass", &lp_pass_type}, {"fetch", &lp_fetch_type},
        {"moment", &lp_moment_type}, {"state", &lp_state_type}, {"outer_fetch", &lp_outer_fetch},
        {"pass_attribute", &lp_pass_attribute}, {"fetch_ends", &lp_fetch_ends},
        {"end_step", &lp_end_step}, {"record_on", &lp_record_on}, {"position", &lp_position},
        {"users", &lp_users}, {"last_positions", &lp_last_positions},
        {"enclosing", &lp_enclosing}, {"report", &lp_report},
        {"site", &lp_site}, {"seen_models", &lp_seen_models},
        {"backward_running", &lp_backward_running}, {"grad_enabled", &lp_grad_enabled},
        {"buckets", &lp_buckets}, {"forward_failed", &lp_forward_failed},
        {"backward_failed", &lp_backward_failed}, {"optimizer_spans", &lp_optimizer_spans},
        {"names", &lp_names},
    };
    size_t count = sizeof(wanted) / sizeof(wanted[0]);
    PyObject *found[sizeof(wanted) / sizeof(wanted[0])];
    for (size_t i = 0; i < count; i++) {
        found[i] = PyDict_GetItemString(parts, wanted[i].name);
        if (found[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "configure_loop() needs %s", wanted[i].name);
            return NULL;
        }
    }
    PyObject *patched = PyDict_GetItemString(parts, "patched");
    PyObject *watched = PyDict_GetItemString(parts, "watched");
    if (patched == NULL || !PyList_Check(patched) || watched == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "configure_loop() needs patched (a list) and watched ((holder, name) pairs)");
        return NULL;
    }
    PyObject *pairs = PySequence_Tuple(watched);
    if (pairs == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pairs); i++) {
        PyObject *pair = PyTuple_GET_ITEM(pairs, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
            || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "configure_loop()'s watched are (holder, name) pairs");
            Py_DECREF(pairs);
            return NULL;
        }
    }
    PyObject *kept = pairs;
    PyObject *max_waiting = PyDict_GetItemString(parts, "max_waiting");
    Py_ssize_t waiting = max_waiting == NULL ? -1 : PyLong_AsSsize_t(max_waiting);
    if (waiting <= 0) {
        Py_DECREF(kept);
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "configure_loop() needs max_waiting, a positive int");
        return NULL;
    }
    PyObject *names = found[count - 1];
    struct {
        const char *name;
        PyObject **kept;
    } named[] = {
        {"step_name", &nm_step}, {"index_key", &nm_index}, {"data_load_name", &nm_data_load},
        {"forward_name", &nm_forward}, {"backward_name", &nm_backward},
        {"optimizer_step_name", &nm_optimizer_step}, {"mode_key", &nm_mode},
        {"train_mode", &nm_mode_train}, {"module_key", &nm_module}, {"wrapper_key", &nm_wrapper},
        {"optimizer_key", &nm_optimizer},
    };
    size_t name_count = sizeof(named) / sizeof(named[0]);
    for (size_t i = 0; i < name_count; i++) {
        PyObject *text = PyDict_Check(names) ? PyDict_GetItemString(names, named[i].name) : NULL;
        if (text == NULL || !PyUnicode_Check(text)) {
            PyErr_Format(PyExc_TypeError, "configure_loop()'s names need %s", named[i].name);
            Py_DECREF(kept);
            return NULL;
        }
    }
    /* The slots read by offset: a class without one of them is refused here, not read. */
    struct {
        size_t type;
        const char *slot;
        Py_ssize_t *at;
    } slots[] = {
        {0, "held", &at_loop_held}, {0, "evaluation_pass", &at_loop_evaluation},
        {0, "training_thread", &at_loop_thread}, {0, "has_optimizer", &at_loop_optimizer},
        {0, "optimizer_steps", &at_loop_steps}, {0, "epoch_passes", &at_loop_passes},
        {0, "dry", &at_loop_dry},
        {4, "role", &at_pass_role}, {4, "batches", &at_pass_batches},
        {7, "epoch", &at_st_epoch}, {7, "step", &at_st_step}, {7, "next_step", &at_st_next_step},
        {7, "detail", &at_st_detail}, {7, "passes", &at_st_passes},
        {7, "last_step_end_ns", &at_st_last_step_end}, {7, "boundary", &at_st_boundary},
        {7, "boundary_ns", &at_st_boundary_ns}, {7, "measure_every_ns", &at_st_measure_every},
        {7, "measured_ns", &at_st_measured}, {7, "holders", &at_st_holders},
        {7, "lock", &at_st_lock},
        {6, "owner", &at_m_owner}, {6, "opened", &at_m_opened}, {6, "index", &at_m_index},
        {6, "parent", &at_m_parent}, {6, "complete", &at_m_complete}, {6, "loop", &at_m_loop},
        {6, "fallback", &at_m_fallback}, {6, "steps", &at_m_steps},
        {6, "boundary_done", &at_m_boundary_done}, {6, "encloses", &at_m_encloses},
        {6, "batches", &at_m_batches}, {6, "cpu", &at_m_cpu},
        {5, "start_ns", &at_f_start}, {5, "end_ns", &at_f_end}, {5, "error", &at_f_error},
        {5, "source", &at_f_source},
    };
    size_t slot_count = sizeof(slots) / sizeof(slots[0]);
    Py_ssize_t offsets[sizeof(slots) / sizeof(slots[0])];
    for (size_t i = 0; i < slot_count; i++) {
        PyObject *type = slots[i].type == 0 ? (PyObject *)Py_TYPE(found[0]) : found[slots[i].type];
        if (!PyType_Check(type)) {
            PyErr_Format(PyExc_TypeError, "configure_loop()'s %s must be a class",
                         wanted[slots[i].type].name);
            Py_DECREF(kept);
            return NULL;
        }
        offsets[i] = slot_offset(type, slots[i].slot);
        if (offsets[i] < 0) {
            Py_DECREF(kept);
            return NULL;
        }
    }
    if (!PyList_Check(found[8]) || !PyList_Check(found[20]) || !PyList_Check(found[21])
        || !PyList_Check(found[22]) || !PyDict_Check(found[19]) || !PyDict_Check(found[25])
        || !PySet_Check(found[16]) || !PyDict_Check(found[15])) {
        PyErr_SetString(PyExc_TypeError, "configure_loop(): outer_fetch, backward_running, "
                        "grad_enabled and buckets are lists, seen_models, optimizer_spans and "
                        "last_positions dicts, enclosing a set");
        Py_DECREF(kept);
        return NULL;
    }
    for (size_t i = 0; i < count; i++) {
        Py_XSETREF(*wanted[i].kept, Py_NewRef(found[i]));
    }
    for (size_t i = 0; i < name_count; i++) {
        Py_XSETREF(*named[i].kept, Py_NewRef(PyDict_GetItemString(names, named[i].name)));
    }
    for (size_t i = 0; i < slot_count; i++) {
        *slots[i].at = offsets[i];
    }
    lp_max_waiting = waiting;
    Py_XSETREF(lp_patched, Py_NewRef(patched));
    Py_XSETREF(lp_watched, kept);
    Py_CLEAR(lp_seen); /* (looked at on the next call) */
    Py_RETURN_NONE;
}

static PyMethodDef hot_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "configure(*, recorder, pending, open, completed, context_var, span_key, scope_span, "
     "time_ns): what the hook spans, the scopes and the mark all work with."},
    {"configure_hook_spans", (PyCFunction)(void (*)(void))configure_hook_spans,
     METH_VARARGS | METH_KEYWORDS,
     "configure_hook_spans(*, build_here, open_on, end_built, end_pure, finished_now, wake_at): "
     "what the hook spans work with, besides what configure gave."},
    {"configure_scopes", (PyCFunction)(void (*)(void))configure_scopes,
     METH_VARARGS | METH_KEYWORDS,
     "configure_scopes(*, enclosing, depth_key, context, restore, scope, random_bits, open_on, "
     "close_span, max_depth): what the scopes work with, besides what configure gave."},
    {"configure_batches", (PyCFunction)(void (*)(void))configure_batches,
     METH_VARARGS | METH_KEYWORDS,
     "configure_batches(*, batches, loop, state, moment, yield_step, batch_name, index_key, "
     "patched, watched): what ci.batches' compiled __next__ works with."},
    {"open_on", (PyCFunction)(void (*)(void))open_on, METH_FASTCALL | METH_KEYWORDS,
     "open_on(rec, name, attributes, start_ns, parent=None): cirron.recording.scopes.open_on, "
     "compiled."},
    {"close_span", (PyCFunction)(void (*)(void))close_span, METH_FASTCALL | METH_KEYWORDS,
     "close_span(opened, error=None, end_ns=None): cirron.recording.scopes.close_span, "
     "compiled."},
    {"configure_encoder", (PyCFunction)(void (*)(void))configure_encoder,
     METH_VARARGS | METH_KEYWORDS,
     "configure_encoder(*, quote, key_texts, key_text, any_value, key_values, events, "
     "mark_event, non_finite, scope_span, encoder, local_flags): what the "
     "spool's encoder works with."},
    {"scope_span", (PyCFunction)(void (*)(void))encoder_scope_span, METH_FASTCALL,
     "scope_span(encoder, span): cirron.exporters.otlp_json._Encoder._scope_span, compiled."},
    {"key_values", (PyCFunction)encoder_key_values, METH_O,
     "key_values(attributes): cirron.exporters.otlp_json.key_values, compiled."},
    {"events", (PyCFunction)encoder_events, METH_O,
     "events(events): cirron.exporters.otlp_json._events, compiled."},
    {"watch_device", (PyCFunction)(void (*)(void))watch_device, METH_FASTCALL,
     "watch_device(cuda, timer): open_hook asks timer(hook) for the device time once cuda[0] "
     "is initialized."},
    {"begin", (PyCFunction)(void (*)(void))hook_begin, METH_FASTCALL,
     "begin(name, attributes): cirron.recording.hook_spans.begin, compiled."},
    {"open_hook", (PyCFunction)(void (*)(void))hook_open, METH_FASTCALL,
     "open_hook(name, attributes): cirron.instrumentors.torch_spans.open_hook, compiled."},
    {"end", (PyCFunction)(void (*)(void))hook_end, METH_FASTCALL | METH_KEYWORDS,
     "end(hook, error=None): cirron.recording.hook_spans.end, compiled."},
    {"configure_loop", (PyCFunction)configure_loop, METH_O,
     "configure_loop(parts): what the compiled step cycle of a plain torch loop works with "
     "(cirron.instrumentors.torch)."},
    {"finished", (PyCFunction)(void (*)(void))hook_finished, METH_FASTCALL,
     "finished(name, parent, attributes, context, start_ns, end_ns, deferred): "
     "cirron.recording.hook_spans._finished, compiled."},
    {NULL},
};

static struct PyModuleDef hot_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cirron.recording._hot",
    .m_doc = "The compiled twins of cirron's hottest hook entries (see cirron.recording.hot).",
    .m_size = -1,
    .m_methods = hot_methods,
};

PyMODINIT_FUNC
PyInit__hot(void)
{
    str_call_impl = PyUnicode_InternFromString("_call_impl");
    str_compiled_call_impl = PyUnicode_InternFromString("_compiled_call_impl");
    if (str_call_impl == NULL || str_compiled_call_impl == NULL) {
        return NULL;
    }
    struct {
        PyObject **name;
        const char *text;
    } interned[] = {
        {&str_current, "current"}, {&str_enabled, "enabled"}, {&str_training, "training"},
        {&str_detail, "detail"}, {&str_session, "session"}, {&str_session_context, "session_context"},
        {&str_lean, "lean"}, {&str_processor, "processor"},
        {&str_noted, "noted"}, {&str_append, "append"}, {&str_noted_many, "noted_many"},
        {&str_initialized, "_initialized"}, {&str_point, "point"}, {&str_kind, "kind"},
        {&str_max_events, "max_events"},
        {&str_end, "end"}, {&str_random_ids, "random_ids"},
        {&str_new_span_id, "new_span_id"},                 {&str_processors, "processors"},
        {&str_span_processors, "_span_processors"}, {&str_on_start, "on_start"},
        {&str_on_end, "on_end"}, {&str_stopped, "_stopped"}, {&str_started_count, "_started"},
        {&str_ended_count, "_ended"}, {&str_open_spans, "_open_spans"}, {&str_sinks, "sinks"},
        {&str_ring, "_ring"}, {&str_capacity, "capacity"}, {&str_wake_at, "_wake_at"},
        {&str_wakeup, "_wakeup"}, {&str_is_set, "is_set"}, {&str_set, "set"},
        {&str_enqueue, "_enqueue"}, {&str_store, "store"}, {&str_ended_deque, "ended_deque"},
        {&str_evictions, "evictions"},         {&str_head_method, "_head"}, {&str_name_method, "_name"}, {&str_parent_method, "_parent"},
                {&str_acquire, "acquire"}, {&str_release, "release"}, {&str_settings, "settings"},
        {&str_step_sampling, "step_sampling"}, {&str_module, "__module__"},
        {&str_wrapped, "__wrapped__"}, {&str_cirron_prefix, "cirron."}, {&str_name, "__name__"},
    };
    for (size_t i = 0; i < sizeof(interned) / sizeof(interned[0]); i++) {
        *interned[i].name = PyUnicode_InternFromString(interned[i].text);
        if (*interned[i].name == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&ModuleCallType) < 0 || PyType_Ready(&HookSpanType) < 0
        || PyType_Ready(&MarkType) < 0 || PyType_Ready(&TwinType) < 0
        || PyType_Ready(&LoopHookType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&hot_module);
    if (module == NULL) {
        return NULL;
    }
    processor_gone_callback = PyCFunction_New(&processor_gone_def, NULL);
    if (processor_gone_callback == NULL) {
        Py_DECREF(module);
        return NULL;
    }
    struct {
        const char *name;
        PyTypeObject *type;
    } types[] = {{"ModuleCall", &ModuleCallType}, {"HookSpan", &HookSpanType},
                 {"Twin", &TwinType}, {"Mark", &MarkType}, {"LoopHook", &LoopHookType}};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        Py_INCREF(types[i].type);
        if (PyModule_AddObject(module, types[i].name, (PyObject *)types[i].type) < 0) {
            Py_DECREF(types[i].type);
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
