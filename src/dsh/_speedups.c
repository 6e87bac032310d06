/*
 * dsh._speedups: optional C accelerator for dsh.json (DESIGN §3.5-§3.6, core spec §4).
 *
 * Three jobs, all mirrored by pure-Python code in dsh/json.py that runs when this module
 * is missing:
 *
 *   freeze_parsed(obj)  orjson's dict/list tree -> FrozenDict/FrozenList tree (numbers checked)
 *   snapshot(obj)       caller data -> frozen copy (the fast path of snapshot_json)
 *   untrack(obj)        take one frozen container out of the cyclic GC
 *
 * Anything unusual (an unsafe int, NaN, +-inf, -0.0, a non-str key, a string holding a
 * surrogate, an unknown type, nesting deeper than FAST_DEPTH, a cycle) raises the private
 * exception `Fallback`; Python then runs its exact iterative walk, which raises the precise
 * InvalidJsonError with a JSON path. This module never builds an error message itself.
 *
 * GC: frozen containers are immutable and built bottom-up, so they cannot take part in a
 * reference cycle. Every container built here is untracked (PyObject_GC_UnTrack) once it is
 * filled, provided each child is either atomic (str/int/float/bool/None) or itself
 * untracked - the rule CPython applies to tuples. Untracking is done last because inserting
 * a container into a dict re-tracks the dict.
 *
 * Trust: an untracked FrozenDict/FrozenList was made by a validating constructor (this module
 * or dsh.json's fallback helpers), and so was its whole subtree; snapshot() returns such a
 * container as-is without walking it. A tracked frozen container (e.g. built with the public
 * FrozenDict(...) constructor, which does not validate) is walked; when nothing in it needs a
 * change it is returned as-is too, and untracked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

/* Deeper trees go to the Python walk, which is iterative and names the spot of a cycle. */
#define FAST_DEPTH 200

static PyTypeObject *frozen_dict_type = NULL;
static PyTypeObject *frozen_list_type = NULL;
static long long max_safe = 0;
static PyObject *Fallback = NULL;
static PyObject *empty_tuple = NULL;

static PyObject *
fallback(void)
{
    PyErr_SetNone(Fallback);
    return NULL;
}

static int
configured(void)
{
    if (frozen_dict_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                         "dsh._speedups.configure() must run before use");
        return 0;
    }
    return 1;
}

/* True when obj is a GC container that the collector currently tracks. */
static inline int
is_tracked(PyObject *obj)
{
    return PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj);
}

/* A frozen type whose instances hold nothing beyond the dict/list itself (no __dict__, no
 * extra slots), so untracking cannot hide a cycle through an attribute. */
static int
untrackable_type(PyTypeObject *t)
{
    PyTypeObject *base;
    if (PyType_IsSubtype(t, frozen_dict_type)) {
        base = &PyDict_Type;
    }
    else if (PyType_IsSubtype(t, frozen_list_type)) {
        base = &PyList_Type;
    }
    else {
        return 0;
    }
    if (t->tp_basicsize != base->tp_basicsize || t->tp_dictoffset != 0) {
        return 0;
    }
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (t->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
        return 0;
    }
#endif
    return 1;
}

/* Untrack a frozen container when safe (see untrackable_type; every key and value atomic or
 * untracked). Returns 1 when obj is now untracked. */
static int
untrack_checked(PyObject *obj)
{
    if (!untrackable_type(Py_TYPE(obj))) {
        return 0;
    }
    if (!PyObject_GC_IsTracked(obj)) {
        return 1;
    }
    if (PyDict_Check(obj)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(obj, &pos, &key, &value)) {
            if (is_tracked(key) || is_tracked(value)) {
                return 0;
            }
        }
    }
    else {
        Py_ssize_t i;
        for (i = 0; i < PyList_GET_SIZE(obj); i++) {
            if (is_tracked(PyList_GET_ITEM(obj, i))) {
                return 0;
            }
        }
    }
    PyObject_GC_UnTrack(obj);
    return 1;
}

static int
has_surrogate(PyObject *s)
{
    Py_ssize_t i, n = PyUnicode_GET_LENGTH(s);
    switch (PyUnicode_KIND(s)) {
    case PyUnicode_1BYTE_KIND:
        return 0;
    case PyUnicode_2BYTE_KIND: {
        const Py_UCS2 *p = PyUnicode_2BYTE_DATA(s);
        for (i = 0; i < n; i++) {
            if ((p[i] & 0xF800) == 0xD800) {
                return 1;
            }
        }
        return 0;
    }
    default: {
        const Py_UCS4 *p = PyUnicode_4BYTE_DATA(s);
        for (i = 0; i < n; i++) {
            if (p[i] >= 0xD800 && p[i] <= 0xDFFF) {
                return 1;
            }
        }
        return 0;
    }
    }
}

static PyObject *
new_frozen_dict(void)
{
    /* dict.__new__ at C level: FrozenDict.__init__ (the re-init guard) never runs. */
    return PyDict_Type.tp_new(frozen_dict_type, empty_tuple, NULL);
}

/* A FrozenList of exactly n NULL slots (filled by the caller; list_dealloc skips NULLs). */
static PyObject *
new_frozen_list(Py_ssize_t n)
{
    PyListObject *lst = (PyListObject *)PyList_Type.tp_new(frozen_list_type, empty_tuple, NULL);
    if (lst == NULL || n == 0) {
        return (PyObject *)lst;
    }
    lst->ob_item = PyMem_Calloc((size_t)n, sizeof(PyObject *));
    if (lst->ob_item == NULL) {
        Py_DECREF(lst);
        return PyErr_NoMemory();
    }
    lst->allocated = n;
    Py_SET_SIZE(lst, n);
    return (PyObject *)lst;
}

static PyObject *walk(PyObject *v, int depth, int parsed);

/* Walk one child; NULL on error. Strings, None and bools take the inline path. */
static inline PyObject *
child(PyObject *x, int depth, int parsed)
{
    PyTypeObject *t = Py_TYPE(x);
    if (t == &PyUnicode_Type && (parsed || PyUnicode_IS_ASCII(x))) {
        return Py_NewRef(x);
    }
    if (x == Py_None || t == &PyBool_Type) {
        return Py_NewRef(x);
    }
    return walk(x, depth, parsed);
}

/* dict (exact) -> new FrozenDict; FrozenDict or subclass -> itself when unchanged, else a
 * rebuilt one of the same type (a subclass is built by calling it, as the Python path does). */
static PyObject *
walk_dict(PyObject *src, int depth, int parsed, int reusable)
{
    PyTypeObject *type = Py_TYPE(src);
    int subclass = reusable && type != frozen_dict_type;
    PyObject *out = NULL, *key, *value;
    Py_ssize_t pos = 0;
    int all_untracked = 1;

    if (depth > FAST_DEPTH) {
        return fallback();
    }
    while (PyDict_Next(src, &pos, &key, &value)) {
        PyObject *snap;
        if (!PyUnicode_CheckExact(key)) {
            Py_XDECREF(out);
            return fallback();
        }
        /* Hold both: a subclass constructor run below could mutate src. */
        Py_INCREF(key);
        Py_INCREF(value);
        snap = child(value, depth + 1, parsed);
        if (snap == NULL) {
            goto error_kv;
        }
        if (snap != value) {
            if (out == NULL) {
                /* First change: clone src (a memcpy for a compact dict), then overwrite. */
                out = subclass ? PyDict_New() : new_frozen_dict();
                if (out == NULL || PyDict_Merge(out, src, 1) < 0) {
                    Py_DECREF(snap);
                    goto error_kv;
                }
            }
            if (PyDict_SetItem(out, key, snap) < 0) {
                Py_DECREF(snap);
                goto error_kv;
            }
        }
        if (all_untracked && is_tracked(snap)) {
            all_untracked = 0;
        }
        Py_DECREF(snap);
        Py_DECREF(key);
        Py_DECREF(value);
    }
    if (out == NULL) {
        if (reusable) {
            if (all_untracked && untrackable_type(type)) {
                PyObject_GC_UnTrack(src);
            }
            return Py_NewRef(src);
        }
        out = new_frozen_dict();
        if (out == NULL || PyDict_Merge(out, src, 1) < 0) {
            Py_XDECREF(out);
            return NULL;
        }
    }
    if (subclass) {
        PyObject *built = PyObject_CallOneArg((PyObject *)type, out);
        Py_DECREF(out);
        if (built == NULL) {
            return NULL;
        }
        if (all_untracked) {
            untrack_checked(built);  /* its constructor ran Python code: check again */
        }
        return built;
    }
    if (all_untracked) {
        PyObject_GC_UnTrack(out);
    }
    return out;

error_kv:
    Py_DECREF(key);
    Py_DECREF(value);
    Py_XDECREF(out);
    return NULL;
}

/* list (exact) -> new FrozenList; FrozenList (exact) -> itself when unchanged, else rebuilt. */
static PyObject *
walk_list(PyObject *src, int depth, int parsed, int reusable)
{
    Py_ssize_t i, j, n = PyList_GET_SIZE(src);
    PyObject *out = NULL;
    int all_untracked = 1;

    if (depth > FAST_DEPTH) {
        return fallback();
    }
    for (i = 0; i < n; i++) {
        PyObject *item, *snap;
        if (PyList_GET_SIZE(src) != n) {  /* changed under us: let the exact walk decide */
            Py_XDECREF(out);
            return fallback();
        }
        item = PyList_GET_ITEM(src, i);
        Py_INCREF(item);
        snap = child(item, depth + 1, parsed);
        Py_DECREF(item);
        if (snap == NULL) {
            Py_XDECREF(out);
            return NULL;
        }
        if (all_untracked && is_tracked(snap)) {
            all_untracked = 0;
        }
        if (out == NULL && snap != item) {
            out = new_frozen_list(n);
            if (out == NULL) {
                Py_DECREF(snap);
                return NULL;
            }
            for (j = 0; j < i; j++) {
                PyList_SET_ITEM(out, j, Py_NewRef(PyList_GET_ITEM(src, j)));
            }
        }
        if (out != NULL) {
            PyList_SET_ITEM(out, i, snap);  /* steals */
        }
        else {
            Py_DECREF(snap);
        }
    }
    if (out == NULL) {
        if (PyList_GET_SIZE(src) != n) {
            return fallback();
        }
        if (reusable) {
            if (all_untracked) {
                PyObject_GC_UnTrack(src);
            }
            return Py_NewRef(src);
        }
        out = new_frozen_list(n);
        if (out == NULL) {
            return NULL;
        }
        for (j = 0; j < n; j++) {
            PyList_SET_ITEM(out, j, Py_NewRef(PyList_GET_ITEM(src, j)));
        }
    }
    if (all_untracked) {
        PyObject_GC_UnTrack(out);
    }
    return out;
}

/* Return the snapshot of v (new reference), NULL with Fallback set, or NULL on a real error. */
static PyObject *
walk(PyObject *v, int depth, int parsed)
{
    PyTypeObject *t = Py_TYPE(v);

    if (t == &PyUnicode_Type) {
        if (parsed || PyUnicode_IS_ASCII(v) || !has_surrogate(v)) {
            return Py_NewRef(v);
        }
        return fallback();  /* surrogate pairs need joining; the Python path does it */
    }
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (overflow || x > max_safe || x < -max_safe) {
            return fallback();
        }
        return Py_NewRef(v);
    }
    if (v == Py_None || t == &PyBool_Type) {
        return Py_NewRef(v);
    }
    if (t == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(v);
        if (!isfinite(d) || (d == 0.0 && signbit(d))) {
            return fallback();
        }
        /* JavaScript has one number type and dsh writes 5, not 5.0 */
        if (d == floor(d) && fabs(d) <= (double)max_safe) {
            return PyLong_FromLongLong((long long)d);
        }
        return Py_NewRef(v);
    }
    if (t == &PyDict_Type) {
        return walk_dict(v, depth, parsed, 0);
    }
    if (t == &PyList_Type) {
        return walk_list(v, depth, parsed, 0);
    }
    if (t == frozen_dict_type || PyType_IsSubtype(t, frozen_dict_type)) {
        if (!PyObject_GC_IsTracked(v)) {
            return Py_NewRef(v);  /* made by a validating constructor: trusted as-is */
        }
        return walk_dict(v, depth, parsed, 1);
    }
    if (t == frozen_list_type) {
        if (!PyObject_GC_IsTracked(v)) {
            return Py_NewRef(v);
        }
        return walk_list(v, depth, parsed, 1);
    }
    /* tuples, sets, bytes, other dict/list subclasses, objects: the walk names them */
    return fallback();
}

PyDoc_STRVAR(configure_doc,
"configure(frozen_dict_type, frozen_list_type, max_safe_int, /) -> None\n\n"
"Bind the frozen container types and the safe-integer bound (2**53 - 1). dsh.json calls\n"
"this once at import.");

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    long long bound;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "configure() takes exactly 3 arguments");
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyDict_Type)
            || !PyType_Check(args[1])
            || !PyType_IsSubtype((PyTypeObject *)args[1], &PyList_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "configure() needs a dict subclass and a list subclass");
        return NULL;
    }
    bound = PyLong_AsLongLong(args[2]);
    if (bound == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (bound <= 0 || bound > (1LL << 53)) {
        PyErr_SetString(PyExc_ValueError, "configure() needs 0 < max_safe_int <= 2**53");
        return NULL;
    }
    Py_XSETREF(frozen_dict_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(frozen_list_type, (PyTypeObject *)Py_NewRef(args[1]));
    max_safe = bound;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(freeze_parsed_doc,
"freeze_parsed(obj, /) -> frozen value\n\n"
"Freeze a tree straight from orjson.loads (dict/list/str/int/float/bool/None, str keys,\n"
"strings without surrogates): dicts become new FrozenDicts, lists new FrozenLists, integral\n"
"floats within +-(2**53 - 1) become ints; the input is not modified. Raises Fallback for an\n"
"unsafe int, -0.0, a non-finite float or nesting deeper than 200, so the caller can run the\n"
"exact walk that names the spot.");

static PyObject *
freeze_parsed(PyObject *module, PyObject *obj)
{
    if (!configured()) {
        return NULL;
    }
    return walk(obj, 0, 1);
}

PyDoc_STRVAR(snapshot_doc,
"snapshot(obj, /) -> frozen value\n\n"
"The fast path of dsh.json.snapshot_json for caller data: validate and copy into frozen\n"
"containers. Untracked frozen containers are returned as-is (a validating constructor made\n"
"them); tracked ones are walked and returned as-is when nothing changes. FrozenDict\n"
"subclasses keep their type. Raises Fallback for anything the exact walk must judge.");

static PyObject *
snapshot(PyObject *module, PyObject *obj)
{
    if (!configured()) {
        return NULL;
    }
    return walk(obj, 0, 0);
}

PyDoc_STRVAR(untrack_doc,
"untrack(obj, /) -> bool\n\n"
"Take one FrozenDict/FrozenList out of the cyclic GC when that is safe: its type adds no\n"
"attributes and every key and value is atomic or already untracked. Returns whether obj is\n"
"now untracked. Only call it on containers whose contents were validated: untracked frozen\n"
"containers are trusted by snapshot().");

static PyObject *
untrack(PyObject *module, PyObject *obj)
{
    if (!configured()) {
        return NULL;
    }
    return PyBool_FromLong(untrack_checked(obj));
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"freeze_parsed", freeze_parsed, METH_O, freeze_parsed_doc},
    {"snapshot", snapshot, METH_O, snapshot_doc},
    {"untrack", untrack, METH_O, untrack_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "dsh._speedups",
    "Optional C accelerator for dsh.json: freezing and GC-untracking of JSON trees.",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (Fallback == NULL) {
        Fallback = PyErr_NewExceptionWithDoc(
            "dsh._speedups.Fallback",
            "Internal: the C path met something it leaves to dsh.json's exact walk.",
            NULL, NULL);
        if (Fallback == NULL) {
            Py_DECREF(module);
            return NULL;
        }
    }
    if (empty_tuple == NULL) {
        empty_tuple = PyTuple_New(0);
        if (empty_tuple == NULL) {
            Py_DECREF(module);
            return NULL;
        }
    }
    if (PyModule_AddObject(module, "Fallback", Py_NewRef(Fallback)) < 0) {
        Py_DECREF(Fallback);
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "FAST_DEPTH", FAST_DEPTH) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
