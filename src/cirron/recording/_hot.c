/* The compiled twins of cirron's hottest hook entries: torch's ``nn.Module.__call__``, and
 * the begin and end of a hook span (the span a hook puts around a forward, a backward or an
 * optimizer step).
 *
 * The pure-Python implementations (cirron.instrumentors.torch_modules.make_module_call,
 * cirron.recording.hook_spans.begin/end, cirron.instrumentors.torch_spans.open_hook) are the
 * reference; this file does the same, and only what runs for every module call or every
 * hook span. cirron.recording.hot picks it, or the pure twins when it is missing or
 * CIRRON_PURE_PYTHON=1.
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

static void
module_call_dealloc(ModuleCall *self)
{
    PyObject_GC_UnTrack(self);
    module_call_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
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
    .tp_dealloc = (destructor)module_call_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ModuleCall, vectorcall),
    .tp_descr_get = module_call_get,
    .tp_getset = module_call_getset,
};

/* ---------------------------------------------------------------------------------------
 * Hook spans: cirron.recording.hook_spans.begin/end and their _finished, compiled.
 *
 * begin notes a start time and the span's parent; end hands the finished span's fields to
 * the processor's queue, where the flush thread builds it. Everything that is not this
 * common path (a parent that is not one of cirron's open lean spans, a call that raised,
 * a span built while the call ran) goes to the pure-Python functions, which
 * configure_hook_spans hands over: the decisions stay in Python, where they can be read.
 * ------------------------------------------------------------------------------------- */

/* What configure_hook_spans was given (owned references; NULL until it is called). */
static PyObject *hs_recorder;        /* cirron.recording.recorder: its .current */
static PyObject *hs_open;            /* training_state.open_hook_spans (a list) */
static PyObject *hs_context_var;     /* the OTel context's ContextVar */
static PyObject *hs_span_key;        /* the context's key of the current span */
static PyObject *hs_scope_span;      /* cirron.otel.spans.ScopeSpan */
static PyObject *hs_build_here;      /* hook_spans.build_here() */
static PyObject *hs_open_on;         /* scopes.open_on(rec, name, attributes, None) */
static PyObject *hs_end_built;       /* hook_spans._end_built(hook, parent, error, deferred, end_ns) */
static PyObject *hs_end_pure;        /* hook_spans' pure end(hook, error): for its own hook spans */
static PyObject *hs_finished_now;    /* ScopeSpan.finished(*fields): built on this thread */
static PyObject *hs_time_ns;         /* time.time_ns */
static Py_ssize_t hs_wake_at;        /* NOTED_WAKE_AT */
static PyObject *hs_device;          /* torch_spans.CUDA: [torch.cuda once attached, or None] */
static PyObject *hs_device_timer;    /* torch_spans._device_timer(hook): sets its device_timer */

static PyObject *str_current, *str_enabled, *str_training, *str_detail, *str_session,
    *str_session_context, *str_lean, *str_end_time, *str_processor, *str_noted, *str_append,
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
    if (hs_recorder == NULL) {
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
        span = PyDict_GetItemWithError(context, hs_span_key);
        Py_XINCREF(span);
        return span;
    }
    span = PyObject_GetItem(context, hs_span_key);
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
    PyObject *rec = PyObject_GetAttr(hs_recorder, str_current);
    if (rec == NULL) {
        return NULL;
    }
    if (rec == Py_None) {
        Py_DECREF(rec);
        Py_RETURN_NONE;
    }
    HookSpanObject *hook = NULL;
    PyObject *context = NULL, *current = NULL, *parent = NULL, *lean = NULL;
    int on = attribute_true(rec, str_enabled);
    if (on > 0) {
        PyObject *training = PyObject_GetAttr(rec, str_training);
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
    if (PyList_GET_SIZE(hs_open) > 0) { /* a hook call inside another: the outer one is built */
        PyObject *done = PyObject_CallNoArgs(hs_build_here);
        if (done == NULL) {
            goto failed;
        }
        Py_DECREF(done);
    }
    if (PyContextVar_Get(hs_context_var, NULL, &context) < 0) {
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
        parent = PyObject_GetAttr(rec, str_session);
        Py_SETREF(context, PyObject_GetAttr(rec, str_session_context));
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
    if ((PyObject *)Py_TYPE(parent) == hs_scope_span) {
        PyObject *end_time = PyObject_GetAttr(parent, str_end_time);
        if (end_time == NULL) {
            goto failed;
        }
        lean_parent = end_time == Py_None;
        Py_DECREF(end_time);
        if (lean_parent) {
            lean = PyObject_GetAttr(rec, str_lean);
            if (lean == NULL) {
                goto failed;
            }
            lean_parent = lean != Py_None;
        }
    }
    if (lean_parent) {
        Py_XSETREF(hook->parent, Py_NewRef(parent));
        hook->thread = PyThread_get_thread_ident();
        Py_XSETREF(hook->start_ns, PyObject_CallNoArgs(hs_time_ns));
        if (hook->start_ns == NULL) {
            goto failed;
        }
        if (PyList_Append(hs_open, (PyObject *)hook) < 0) {
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
    PyObject *rec = PyObject_GetAttr(hs_recorder, str_current);
    if (rec == NULL) {
        return -1;
    }
    PyObject *processor = rec == Py_None ? Py_NewRef(Py_None) : PyObject_GetAttr(rec, str_processor);
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
            PyObject *appended = PyObject_CallMethodOneArg(noted, str_append, record);
            Py_DECREF(record);
            Py_XDECREF(appended);
            Py_ssize_t waiting = appended == NULL ? -1 : PyObject_Length(noted);
            if (waiting < 0) {
                result = -1;
            }
            else if (waiting >= hs_wake_at) {
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
    for (Py_ssize_t i = PyList_GET_SIZE(hs_open) - 1; i >= 0; i--) {
        if (PyList_GET_ITEM(hs_open, i) == hook) {
            return PySequence_DelItem(hs_open, i);
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
    PyObject *end_ns = PyObject_CallNoArgs(hs_time_ns);
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
    PyObject *recorder, *open, *context_var, *span_key, *scope_span, *build_here, *open_on,
        *end_built, *end_pure, *finished_now, *time_ns;
    Py_ssize_t wake_at;
    static char *names[] = {"recorder", "open", "context_var", "span_key", "scope_span",
                            "build_here", "open_on", "end_built", "end_pure", "finished_now",
                            "time_ns", "wake_at", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OO!OOOOOOOOOn", names, &recorder,
                                     &PyList_Type, &open, &context_var, &span_key, &scope_span,
                                     &build_here, &open_on, &end_built, &end_pure, &finished_now,
                                     &time_ns, &wake_at)) {
        return NULL;
    }
    if (!PyContextVar_CheckExact(context_var)) {
        PyErr_SetString(PyExc_TypeError, "context_var must be a contextvars.ContextVar");
        return NULL;
    }
    Py_XSETREF(hs_recorder, Py_NewRef(recorder));
    Py_XSETREF(hs_open, Py_NewRef(open));
    Py_XSETREF(hs_context_var, Py_NewRef(context_var));
    Py_XSETREF(hs_span_key, Py_NewRef(span_key));
    Py_XSETREF(hs_scope_span, Py_NewRef(scope_span));
    Py_XSETREF(hs_build_here, Py_NewRef(build_here));
    Py_XSETREF(hs_open_on, Py_NewRef(open_on));
    Py_XSETREF(hs_end_built, Py_NewRef(end_built));
    Py_XSETREF(hs_end_pure, Py_NewRef(end_pure));
    Py_XSETREF(hs_finished_now, Py_NewRef(finished_now));
    Py_XSETREF(hs_time_ns, Py_NewRef(time_ns));
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

static PyMethodDef hot_methods[] = {
    {"configure_hook_spans", (PyCFunction)(void (*)(void))configure_hook_spans,
     METH_VARARGS | METH_KEYWORDS,
     "configure_hook_spans(*, recorder, open, context_var, span_key, scope_span, build_here, "
     "open_on, end_built, end_pure, finished_now, time_ns, wake_at): what the hook spans work "
     "with."},
    {"watch_device", (PyCFunction)(void (*)(void))watch_device, METH_FASTCALL,
     "watch_device(cuda, timer): open_hook asks timer(hook) for the device time once cuda[0] "
     "is initialized."},
    {"begin", (PyCFunction)(void (*)(void))hook_begin, METH_FASTCALL,
     "begin(name, attributes): cirron.recording.hook_spans.begin, compiled."},
    {"open_hook", (PyCFunction)(void (*)(void))hook_open, METH_FASTCALL,
     "open_hook(name, attributes): cirron.instrumentors.torch_spans.open_hook, compiled."},
    {"end", (PyCFunction)(void (*)(void))hook_end, METH_FASTCALL | METH_KEYWORDS,
     "end(hook, error=None): cirron.recording.hook_spans.end, compiled."},
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
        {&str_lean, "lean"}, {&str_end_time, "_end_time"}, {&str_processor, "processor"},
        {&str_noted, "noted"}, {&str_append, "append"}, {&str_noted_many, "noted_many"},
        {&str_initialized, "_initialized"},
    };
    for (size_t i = 0; i < sizeof(interned) / sizeof(interned[0]); i++) {
        *interned[i].name = PyUnicode_InternFromString(interned[i].text);
        if (*interned[i].name == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&ModuleCallType) < 0 || PyType_Ready(&HookSpanType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&hot_module);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&ModuleCallType);
    if (PyModule_AddObject(module, "ModuleCall", (PyObject *)&ModuleCallType) < 0) {
        Py_DECREF(&ModuleCallType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&HookSpanType);
    if (PyModule_AddObject(module, "HookSpan", (PyObject *)&HookSpanType) < 0) {
        Py_DECREF(&HookSpanType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
