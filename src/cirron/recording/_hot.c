/* The compiled twin of cirron's hottest hook entry: torch's ``nn.Module.__call__``.
 *
 * The pure-Python implementation (cirron.instrumentors.torch_modules.make_module_call) is
 * the reference; this file does the same, and only what runs for every module call of a
 * model. cirron.recording.hot picks it, or the pure twin when it is missing or CIRRON_PURE_PYTHON=1.
 *
 * A submodule call (inside an outermost forward) goes straight to torch's own
 * ``_call_impl`` (or a compiled module's ``_compiled_call_impl``) with no Python frame of
 * ours: cheaper than torch's own ``_wrapped_call_impl``, a Python function. The outermost
 * call sets the process-wide "inside a forward" flag and hands the call to the Python
 * function that decides what the call means (``outermost(original, module, args,
 * kwargs)``), so that logic stays in Python, where it can be read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>  /* offsetof */

/* An outermost module call is running (any thread), as torch_modules._inside_forward. */
static int inside_forward = 0;

static PyObject *str_call_impl;          /* "_call_impl" */
static PyObject *str_compiled_call_impl; /* "_compiled_call_impl" */

typedef struct {
    PyObject_HEAD
    PyObject *original;  /* the __call__ it replaced */
    PyObject *outermost; /* outermost(original, module, args, kwargs) */
    int torch_call;      /* original is torch's _wrapped_call_impl: call _call_impl directly */
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
    return outermost_call(self, args, nargs, kwnames);
}

static PyObject *
module_call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *original, *outermost;
    int torch_call;
    static char *names[] = {"original", "outermost", "torch_call", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOp", names, &original, &outermost, &torch_call)) {
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
    self->vectorcall = module_call_vectorcall;
    return (PyObject *)self;
}

static int
module_call_traverse(ModuleCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->original);
    Py_VISIT(self->outermost);
    return 0;
}

static int
module_call_clear(ModuleCall *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->outermost);
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
    .tp_doc = "ModuleCall(original, outermost, torch_call): cirron's nn.Module.__call__.",
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

static struct PyModuleDef hot_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cirron.recording._hot",
    .m_doc = "The compiled twin of cirron's hottest hook entry (see cirron.recording.hot).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__hot(void)
{
    str_call_impl = PyUnicode_InternFromString("_call_impl");
    str_compiled_call_impl = PyUnicode_InternFromString("_compiled_call_impl");
    if (str_call_impl == NULL || str_compiled_call_impl == NULL) {
        return NULL;
    }
    if (PyType_Ready(&ModuleCallType) < 0) {
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
    return module;
}
