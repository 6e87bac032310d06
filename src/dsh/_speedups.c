/*
 * dsh._speedups: optional C accelerator (docs/rules.md#immutability, docs/formats.md#lossless-json). Every function is
 * mirrored by pure-Python code that runs when this module is missing and stays the reference
 * (the tests compare both):
 *
 *   freezing (dsh.json)   freeze_parsed, snapshot, snapshot_events, untrack: orjson trees and
 *                         caller data -> FrozenDict/FrozenList trees (Events), numbers
 *                         checked, out of the cyclic GC
 *   the load path         scan_lines (JSONL records), decode_rows (SQLite rows), stored_prescan,
 *                         message_shape_ok, admit_plain (restore admission), seqs_contiguous
 *   the session           gather_messages (derive_messages), append_event (an append's
 *                         shape check and envelope)
 *   the SQLite write path rows_text (seal checksum text), encode_rows (a batch's rows)
 *   the adapters         record_texts (framework records cut out of a checked row's text),
 *                         pick_rows (a selective read's pass over checked rows, cutting them),
 *                         read_rows with sqlite_bind/sqlite_open (that read and its seal check
 *                         through SQLite's C API, resolved at run time from _sqlite3's library)
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
#include <string.h>

#ifndef DSH_SOURCE_SHA256
/* setup.py defines it; a build by other means cannot be told from its source, so dsh.json
 * treats it as stale wherever the source sits beside it */
#define DSH_SOURCE_SHA256 ""
#endif

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
static PyObject *frozen_of(PyTypeObject *type, PyObject *const *kv, Py_ssize_t pairs);

/* While a load pass runs (scan_lines, decode_rows): one object per distinct short string
 * value, so the thousands of "text", "user", "turn/start", model and tool names of a log are
 * stored once (orjson already shares keys, not values). An open-addressing table of its own,
 * kept between passes and emptied after each: a dict would hash every value with SipHash and
 * insert it, a tenth of a JSONL scan; equal strs have equal kind, length and data (PEP 393's
 * canonical form), so those are compared. str_cache_on is 0 outside a load pass.
 * The table starts small and doubles when half full, up to STR_CACHE_MAX_SIZE strings: its
 * slots are hashed, so a pass touches every page of it, and a table sized for the largest
 * pass would keep half a megabyte resident in a process that only ever reads a short session
 * (docs/adapters.md#memory). */
#define STR_CACHE_MAX_LEN 32
#define STR_CACHE_MAX_SIZE 32768
#define STR_CACHE_MIN_SLOTS 2048  /* a power of two; the table's first size */
static int str_cache_on = 0;
static PyObject **str_cache_slots = NULL;  /* str_cache_mask + 1 entries, NULL when free */
static uint32_t *str_cache_used = NULL;    /* the filled slots, to empty them after a pass */
static Py_ssize_t str_cache_count = 0;
static size_t str_cache_mask = 0;          /* slots - 1 (slots a power of two) */
static Py_ssize_t str_cache_limit = 0;     /* strings it holds before it grows: half its slots */

static inline size_t
str_cache_index(const unsigned char *data, Py_ssize_t size, int kind)
{
    /* eight bytes a step (a byte-at-a-time hash was a tenth of a scan) */
    uint64_t h = 0x9E3779B97F4A7C15ULL * (uint64_t)(4 * size + kind), w;
    Py_ssize_t i = 0;
    for (; i + 8 <= size; i += 8) {
        memcpy(&w, data + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
    }
    if (i < size) {
        w = 0;
        memcpy(&w, data + i, (size_t)(size - i));
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
    }
    h ^= h >> 29;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 32;
    return (size_t)h;  /* the caller masks it with the table's size */
}

/* Double the table (rehashing what it holds) while it is below STR_CACHE_MAX_SIZE strings;
 * when it is at that size or the memory is refused it stays as it is, and a full table only
 * stops sharing new strings (sharing saves memory, nothing depends on it). */
static void
str_cache_grow(void)
{
    size_t slots = 2 * (str_cache_mask + 1), i;
    Py_ssize_t k;
    PyObject **table;
    uint32_t *used;
    if (str_cache_limit >= STR_CACHE_MAX_SIZE) {
        return;
    }
    table = PyMem_RawCalloc(slots, sizeof(PyObject *));
    used = PyMem_RawMalloc(slots / 2 * sizeof(uint32_t));
    if (table == NULL || used == NULL) {
        PyMem_RawFree(table);
        PyMem_RawFree(used);
        return;
    }
    for (k = 0; k < str_cache_count; k++) {
        PyObject *x = str_cache_slots[str_cache_used[k]];
        int kind = PyUnicode_KIND(x);
        for (i = str_cache_index(PyUnicode_DATA(x), PyUnicode_GET_LENGTH(x) * kind, kind)
                 & (slots - 1);
             table[i] != NULL; i = (i + 1) & (slots - 1)) {
        }
        table[i] = x;
        used[k] = (uint32_t)i;
    }
    PyMem_RawFree(str_cache_slots);
    PyMem_RawFree(str_cache_used);
    str_cache_slots = table;
    str_cache_used = used;
    str_cache_mask = slots - 1;
    str_cache_limit = (Py_ssize_t)(slots / 2);
}

/* The cached str equal to x (x itself the first time); a new reference. */
static inline PyObject *
shared_str(PyObject *x)
{
    Py_ssize_t length = PyUnicode_GET_LENGTH(x), size;
    int kind;
    const unsigned char *data;
    size_t i;
    if (!str_cache_on || length > STR_CACHE_MAX_LEN) {
        return Py_NewRef(x);
    }
    kind = PyUnicode_KIND(x);
    data = PyUnicode_DATA(x);
    size = length * kind;
    if (str_cache_count >= str_cache_limit) {
        str_cache_grow();
    }
    for (i = str_cache_index(data, size, kind) & str_cache_mask;; i = (i + 1) & str_cache_mask) {
        PyObject *slot = str_cache_slots[i];
        if (slot == NULL) {
            if (str_cache_count < str_cache_limit) {
                str_cache_slots[i] = Py_NewRef(x);
                str_cache_used[str_cache_count++] = (uint32_t)i;
            }
            return Py_NewRef(x);
        }
        if (slot == x || (PyUnicode_GET_LENGTH(slot) == length && PyUnicode_KIND(slot) == kind
                          && memcmp(PyUnicode_DATA(slot), data, (size_t)size) == 0)) {
            return Py_NewRef(slot);
        }
    }
}

/* While a load pass runs, also one object per distinct chunk record that the expansion of a
 * packed chunk row builds (expand_row, docs/formats.md#chunk-rows): the
 * {"type": "text-delta", "index": 0, "text": " the"} chunk of a repeated token and the
 * {"turn", "step", "chunk"} data around it. They are frozen, so equal ones can be one object
 * (as equal short strs are), and looking one up costs less than building it. Equal means the
 * same keys in the same order and the same values (ints by value; short strs and records are
 * shared in a pass, so equal ones are the same object). Long strs, floats and anything
 * tracked are never shared. A direct-mapped table: a newer record takes the slot of an older
 * one (chunks repeat within a turn, where the table keeps them). Emptied after each pass. */
#define CONS_MAX_PAIRS 6
#define CONS_SLOTS 4096
static PyObject **cons_slots = NULL;
static uint64_t *cons_hashes = NULL;
static uint32_t *cons_used = NULL;  /* the filled slots, to empty them after a pass */
static Py_ssize_t cons_count = 0;

/* The hash of one member value into *h; 0 when the value makes its record unshareable. */
static inline int
cons_value_hash(PyObject *v, uint64_t *h)
{
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyUnicode_Type) {
        if (PyUnicode_GET_LENGTH(v) > STR_CACHE_MAX_LEN) {
            return 0;  /* long text is rarely repeated: not worth a comparison */
        }
        *h = (uint64_t)(uintptr_t)v;
        return 1;
    }
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        *h = (uint64_t)x * 0x9E3779B97F4A7C15ULL + 0x51ED27;
        return 1;
    }
    if (v == Py_None || v == Py_True || v == Py_False
            || ((t == frozen_dict_type || t == frozen_list_type) && !PyObject_GC_IsTracked(v))) {
        *h = (uint64_t)(uintptr_t)v;
        return 1;
    }
    return 0;
}

/* The hash of the record kv (pairs keys and values, in order) into *h; 0 when unshareable. */
static inline int
cons_hash_kv(PyObject *const *kv, Py_ssize_t pairs, uint64_t *h)
{
    uint64_t acc = 14695981039346656037ULL ^ (uint64_t)pairs, vh;
    Py_ssize_t i;
    for (i = 0; i < pairs; i++) {
        Py_hash_t kh = PyObject_Hash(kv[2 * i]);  /* a dict key's str: its hash is cached */
        if (kh == -1 || !cons_value_hash(kv[2 * i + 1], &vh)) {
            PyErr_Clear();
            return 0;
        }
        acc = (acc ^ (uint64_t)kh) * 1099511628211ULL;
        acc = (acc ^ vh) * 1099511628211ULL;
    }
    *h = acc ^ (acc >> 29);
    return 1;
}

/* 1 when the table's record d holds exactly the members kv, in that order. */
static inline int
cons_equal(PyObject *d, PyObject *const *kv, Py_ssize_t pairs)
{
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    if (PyDict_GET_SIZE(d) != pairs) {
        return 0;
    }
    while (PyDict_Next(d, &pos, &key, &value)) {
        PyObject *k = kv[2 * i], *v = kv[2 * i + 1];
        if (key != k && PyUnicode_Compare(key, k) != 0) {
            return 0;
        }
        if (value != v) {
            if (!(PyLong_CheckExact(value) && PyLong_CheckExact(v))
                    || PyObject_RichCompareBool(value, v, Py_EQ) != 1) {
                PyErr_Clear();
                return 0;
            }
        }
        i++;
    }
    return 1;
}

/* The slot of hash h; *found 1 when it holds a record equal to kv. -1 when no pass runs. */
static inline Py_ssize_t
cons_slot(PyObject *const *kv, Py_ssize_t pairs, uint64_t h, int *found)
{
    size_t i = (size_t)h & (CONS_SLOTS - 1);
    PyObject *slot;
    if (cons_slots == NULL || !str_cache_on) {
        return -1;
    }
    slot = cons_slots[i];
    *found = slot != NULL && cons_hashes[i] == h && cons_equal(slot, kv, pairs);
    return (Py_ssize_t)i;
}

/* The records evicted from the table during a pass, released when it ends: releasing one
 * at eviction touches an object long out of the cache and stalls the scan on that miss (most
 * of the sharing's cost); released together at the end, the misses overlap. */
static PyObject **cons_evicted = NULL;
static Py_ssize_t cons_evicted_count = 0, cons_evicted_cap = 0;

/* Keep d (an untracked FrozenDict) in slot i for hash h, in place of what it held: records
 * repeat mostly within a turn or everywhere (sources, reasons), so the newest is kept. */
static inline void
cons_keep(Py_ssize_t i, uint64_t h, PyObject *d)
{
    PyObject *old = cons_slots[i];
    cons_slots[i] = Py_NewRef(d);
    cons_hashes[i] = h;
    if (old == NULL) {
        cons_used[cons_count++] = (uint32_t)i;
        return;
    }
    if (cons_evicted_count == cons_evicted_cap) {
        Py_ssize_t cap = cons_evicted_cap ? 2 * cons_evicted_cap : 4096;
        PyObject **grown = PyMem_RawRealloc(cons_evicted, (size_t)cap * sizeof(PyObject *));
        if (grown == NULL) {
            Py_DECREF(old);  /* no room to defer it: release it now */
            return;
        }
        cons_evicted = grown;
        cons_evicted_cap = cap;
    }
    cons_evicted[cons_evicted_count++] = old;
}

/* A new FrozenDict of the members kv (see frozen_of), or the table's equal one. */
static PyObject *
frozen_shared(PyObject *const *kv, Py_ssize_t pairs)
{
    uint64_t h;
    int found = 0;
    Py_ssize_t i = -1;
    PyObject *d;
    if (pairs <= CONS_MAX_PAIRS && cons_hash_kv(kv, pairs, &h)) {
        i = cons_slot(kv, pairs, h, &found);
        if (found) {
            return Py_NewRef(cons_slots[i]);
        }
    }
    d = frozen_of(frozen_dict_type, kv, pairs);
    if (d != NULL && i >= 0 && !PyObject_GC_IsTracked(d)) {
        cons_keep(i, h, d);
    }
    return d;
}

/* End a load pass: the cached strs and records are released and the tables emptied. */
static void jp_hot_clear(void);

/* 1 while a pass holds the cyclic GC off (it was on when the pass began). A pass builds
 * hundreds of thousands of containers, untracked as they are filled: the collections their
 * allocations would trigger find nothing of theirs to collect, and one of them walks every
 * tracked object of the process (a twentieth of a cold load). */
static int pass_gc_off = 0;

static void
str_cache_close(void)
{
    Py_ssize_t k;
    str_cache_on = 0;
    jp_hot_clear();
    if (pass_gc_off) {
        pass_gc_off = 0;
        PyGC_Enable();
    }
    for (k = 0; k < cons_count; k++) {
        Py_CLEAR(cons_slots[cons_used[k]]);
    }
    cons_count = 0;
    for (k = 0; k < cons_evicted_count; k++) {
        Py_DECREF(cons_evicted[k]);
    }
    cons_evicted_count = 0;
    cons_evicted_cap = 0;
    PyMem_RawFree(cons_evicted);
    cons_evicted = NULL;
    for (k = 0; k < str_cache_count; k++) {
        Py_CLEAR(str_cache_slots[str_cache_used[k]]);
    }
    str_cache_count = 0;
}

/* Walk one child; NULL on error. Strings, None and bools take the inline path. */
static inline PyObject *
child(PyObject *x, int depth, int parsed)
{
    PyTypeObject *t = Py_TYPE(x);
    if (t == &PyUnicode_Type && (parsed || PyUnicode_IS_ASCII(x))) {
        return parsed ? shared_str(x) : Py_NewRef(x);
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

/* ---------------------------------------------------------------------------------------
 * Freezing in place. A tree that orjson.loads has just returned belongs to the load pass
 * alone: the frozen tree can be that same tree, its dicts and lists retyped to FrozenDict /
 * FrozenList (and the record to Event) instead of copied. Retyping is sound only when the
 * frozen type has exactly the base type's layout and deallocation (a heap subclass with
 * __slots__ = (), no finalizer); retype_ok says whether configure() found that, and the copying
 * walk runs otherwise. Only a container whose one reference is its parent's (or the caller's)
 * is retyped; anything shared is copied. On Fallback the half-frozen tree is discarded: the
 * callers re-decode from the original bytes.
 */

static int retype_ok = 0;

static int
same_layout(PyTypeObject *t, PyTypeObject *base)
{
#ifdef Py_GIL_DISABLED
    (void)t;
    (void)base;
    return 0;  /* objects' type words are shared state there: always copy */
#else
    return PyType_IsSubtype(t, base) && untrackable_type(t)
        && (t->tp_flags & Py_TPFLAGS_HEAPTYPE) && t->tp_itemsize == base->tp_itemsize
        && t->tp_weaklistoffset == base->tp_weaklistoffset && t->tp_free == base->tp_free
        && t->tp_finalize == NULL && t->tp_del == NULL;
#endif
}

/* obj (an exact dict/list or an instance of a same-layout subclass) becomes a `to`. */
static inline void
retype(PyObject *obj, PyTypeObject *to)
{
    PyTypeObject *from = Py_TYPE(obj);
    Py_INCREF(to);  /* instances of heap types own a reference to their type */
    Py_SET_TYPE(obj, to);
    if (from->tp_flags & Py_TPFLAGS_HEAPTYPE) {
        Py_DECREF(from);
    }
}

static PyObject *own_walk(PyObject *v, int depth);

/* 0 while decode_line freezes a chunk row: own_dict then shares none of its records. */
static int own_cons = 1;

/* 1: the owned tree came from orjson.loads (no lone surrogates: strings are shared as they
 * are); 0 while snapshot_events freezes caller events it was handed (owned=True): strings are
 * checked as walk(v, depth, 0) checks them. */
static int own_parsed = 1;

/* 1 when tag (a parsed record's "type", maybe NULL) names a chunk row: "text-chunks",
 * "reasoning-chunks" or "tool-chunks" (docs/formats.md#chunk-rows), all ending "-chunks",
 * which no event type does; a cheap test on the str orjson made (not yet shared). */
static inline int
is_chunk_row_tag(PyObject *tag)
{
    Py_ssize_t n;
    if (tag == NULL || !PyUnicode_CheckExact(tag) || !PyUnicode_IS_COMPACT_ASCII(tag)) {
        return 0;
    }
    n = PyUnicode_GET_LENGTH(tag);
    return n >= 7 && memcmp((const char *)PyUnicode_DATA(tag) + n - 7, "-chunks", 7) == 0;
}

/* d (a nested record just frozen in place, untracked; its members kv) or the cons table's
 * equal record, as
 * frozen_shared does for the records a chunk row expands to: the {"kind": "user"} source of
 * every user message, the {"turn", "step"} data of a step's events, the model source of every
 * assistant message are one object each while a load pass runs. Never an event itself (depth
 * 0): it is retyped to Event when it has no other owner. New reference. */
static PyObject *
own_shared(PyObject *d, PyObject *const *kv, Py_ssize_t pairs)
{
    uint64_t h;
    int found = 0;
    Py_ssize_t i;
    if (!cons_hash_kv(kv, pairs, &h)) {
        return Py_NewRef(d);
    }
    i = cons_slot(kv, pairs, h, &found);
    if (found) {
        return Py_NewRef(cons_slots[i]);
    }
    if (i >= 0) {
        cons_keep(i, h, d);
    }
    return Py_NewRef(d);
}

/* The parsed dict d (owned by its parent alone) frozen in place; new reference or NULL. */
static PyObject *
own_dict(PyObject *d, int depth)
{
    Py_ssize_t pos = 0, pairs = 0;
    PyObject *key, *value, *kv[2 * CONS_MAX_PAIRS];
    int all_untracked = 1;
    if (depth > FAST_DEPTH) {
        return fallback();
    }
    while (PyDict_Next(d, &pos, &key, &value)) {
        PyObject *snap;
        if (!PyUnicode_CheckExact(key)) {
            return fallback();
        }
        snap = own_walk(value, depth + 1);
        if (snap == NULL) {
            return NULL;
        }
        /* replacing the value of a present key neither resizes nor reorders the dict */
        if (snap != value && PyDict_SetItem(d, key, snap) < 0) {
            Py_DECREF(snap);
            return NULL;
        }
        if (all_untracked && is_tracked(snap)) {
            all_untracked = 0;
        }
        if (pairs < CONS_MAX_PAIRS) {  /* the members, borrowed from d, for own_shared */
            kv[2 * pairs] = key;
            kv[2 * pairs + 1] = snap;
        }
        pairs++;
        Py_DECREF(snap);
    }
    retype(d, frozen_dict_type);
    if (all_untracked) {
        PyObject_GC_UnTrack(d);
        if (depth > 0 && own_cons && pairs <= CONS_MAX_PAIRS) {
            return own_shared(d, kv, pairs);
        }
    }
    return Py_NewRef(d);
}

/* The parsed list l (owned by its parent alone) frozen in place; new reference or NULL. */
static PyObject *
own_list(PyObject *l, int depth)
{
    Py_ssize_t i, n = PyList_GET_SIZE(l);
    int all_untracked = 1;
    if (depth > FAST_DEPTH) {
        return fallback();
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(l, i);
        PyObject *snap = own_walk(item, depth + 1);
        if (snap == NULL) {
            return NULL;
        }
        if (snap != item) {
            PyList_SET_ITEM(l, i, snap);  /* steals snap; the slot held the only ref to item */
            Py_DECREF(item);
        }
        else {
            Py_DECREF(snap);
        }
        if (all_untracked && is_tracked(PyList_GET_ITEM(l, i))) {
            all_untracked = 0;
        }
    }
    retype(l, frozen_list_type);
    if (all_untracked) {
        PyObject_GC_UnTrack(l);
    }
    return Py_NewRef(l);
}

/* Like walk(v, depth, 1), but containers only this tree references are frozen in place. */
static PyObject *
own_walk(PyObject *v, int depth)
{
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyUnicode_Type) {
        return own_parsed ? shared_str(v) : walk(v, depth, 0);
    }
    if (v == Py_None || t == &PyBool_Type) {
        return Py_NewRef(v);
    }
    if (retype_ok && Py_REFCNT(v) == 1) {
        if (t == &PyDict_Type) {
            return own_dict(v, depth);
        }
        if (t == &PyList_Type) {
            return own_list(v, depth);
        }
    }
    return walk(v, depth, own_parsed);
}

/* Freeze what orjson.loads returned, stealing `parsed`; new reference or NULL (Fallback). */
static PyObject *
freeze_owned(PyObject *parsed)
{
    PyObject *frozen = own_walk(parsed, 0);
    Py_DECREF(parsed);
    return frozen;
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
    retype_ok = same_layout(frozen_dict_type, &PyDict_Type)
        && same_layout(frozen_list_type, &PyList_Type);
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

PyDoc_STRVAR(snapshot_events_doc,
"snapshot_events(seed, start, event_type, out, owned=False, /) -> int\n\n"
"Append to the list out the snapshot of each item of the list or tuple seed from index start\n"
"on, as an exact event_type (a FrozenDict subclass adding no attributes) when snapshot()\n"
"gives a FrozenDict; an event_type item already untracked is appended as it is. Stops at the\n"
"first item snapshot() leaves to the Python walk (Fallback), or whose snapshot is no\n"
"FrozenDict, and returns its index (len(seed) when none): the caller judges it. The Python\n"
"reference is dsh.session._session._frozen_prefix. owned: the caller hands the items over:\n"
"an exact dict or list that nothing but its parent (or the seed) references is frozen in\n"
"place (retyped, the seed's item becoming the event) instead of copied; anything shared is\n"
"copied. After a Fallback an item may be left part frozen in place, its frozen parts\n"
"validated: the Python walk gives the same snapshot from it.");

static PyObject *
snapshot_events(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *seed, *out, **items;
    PyTypeObject *event_type;
    Py_ssize_t i, n, start;
    int owned = 0;

    if (!configured()) {
        return NULL;
    }
    if (nargs < 4 || nargs > 5 || !(PyList_CheckExact(args[0]) || PyTuple_CheckExact(args[0]))
            || !PyType_Check(args[2]) || !PyList_CheckExact(args[3])
            || !PyType_IsSubtype((PyTypeObject *)args[2], frozen_dict_type)) {
        PyErr_SetString(PyExc_TypeError,
                        "snapshot_events(list | tuple, int, FrozenDict subclass, list[, bool])");
        return NULL;
    }
    start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) {
        return NULL;
    }
    seed = args[0];
    event_type = (PyTypeObject *)args[2];
    out = args[3];
    if (nargs == 5) {
        owned = PyObject_IsTrue(args[4]);
        if (owned < 0) {
            return NULL;
        }
        /* retyping to the event type needs its layout to be the dict's, as for FrozenDict */
        owned = owned && retype_ok && same_layout(event_type, &PyDict_Type);
    }
    n = PySequence_Fast_GET_SIZE(seed);
    items = PySequence_Fast_ITEMS(seed);
    for (i = start < 0 ? 0 : start; i < n; i++) {
        PyObject *snap, *event;
        int appended;
        if (Py_TYPE(items[i]) == event_type && !is_tracked(items[i])) {
            event = Py_NewRef(items[i]);  /* made by a validating constructor */
        }
        else if (owned && Py_TYPE(items[i]) == &PyDict_Type && Py_REFCNT(items[i]) == 1) {
            /* the seed's reference is the only one: the event is this dict, frozen in place
             * (own_dict retypes it to FrozenDict, then it becomes an event_type) */
            int saved_cons = own_cons, saved_parsed = own_parsed;
            own_cons = 0;
            own_parsed = 0;
            snap = own_dict(items[i], 0);
            own_cons = saved_cons;
            own_parsed = saved_parsed;
            if (snap == NULL) {
                if (PyErr_ExceptionMatches(Fallback)) {
                    PyErr_Clear();
                    break;
                }
                return NULL;
            }
            retype(snap, event_type);
            event = snap;
        }
        else {
            snap = walk(items[i], 0, 0);
            if (snap == NULL) {
                if (PyErr_ExceptionMatches(Fallback)) {
                    PyErr_Clear();
                    break;
                }
                return NULL;
            }
            if (Py_TYPE(snap) == event_type) {
                event = snap;
            }
            else if (Py_TYPE(snap) == frozen_dict_type) {
                event = PyDict_Type.tp_new(event_type, empty_tuple, NULL);
                if (event == NULL || PyDict_Update(event, snap) < 0) {
                    Py_XDECREF(event);
                    Py_DECREF(snap);
                    return NULL;
                }
                if (!is_tracked(snap)) {
                    PyObject_GC_UnTrack(event);  /* its values are snap's: untracked or atomic */
                }
                Py_DECREF(snap);
            }
            else {
                Py_DECREF(snap);
                break;
            }
        }
        appended = PyList_Append(out, event);
        Py_DECREF(event);
        if (appended < 0) {
            return NULL;
        }
    }
    return PyLong_FromSsize_t(i);
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

/* ---------------------------------------------------------------------------------------
 * Record decoding and seed pre-scans (the load path, docs/stores.md#the-backend-contract, docs/formats.md#jsonl).
 *
 * Each function below does the common case in one C pass and stops (or reports an index)
 * wherever Python has something to judge; the Python code it shortcuts stays the reference,
 * produces every error message, and runs alone when this module is missing.
 */

static PyObject *s_digest = NULL;
static PyObject *s_type, *s_seq, *s_time, *s_data, *s_seq0, *s_time0, *s_turn, *s_step,
    *s_index, *s_dt, *s_texts, *s_id, *s_name, *s_args, *s_chunk, *s_text, *s_arguments_delta,
    *s_assistant_chunk, *s_text_chunks, *s_reasoning_chunks, *s_tool_chunks, *s_text_delta,
    *s_reasoning_delta, *s_tool_delta, *s_reason, *s_kind, *s_trigger, *s_message, *s_role,
    *s_content, *s_source, *s_provenance, *s_call_id, *s_is_error, *s_error, *s_ignorable,
    *s_fallback, *s_request_header, *s_request_header_delta, *s_request_context, *s_mode_set,
    *s_steering,
    *s_turn_start, *s_turn_end, *s_user_message, *s_assistant_message, *s_tool_result,
    *s_end_seed, *s_completed, *s_blocked, *s_max_tokens, *s_interrupted, *s_aborted,
    *s_disposed, *s_error_kind, *s_surface_op, *s_append, *s_source_event_seqs,
    *s_user, *s_system, *s_assistant, *s_system_message, *s_model, *s_provider, *s_tool,
    *s_tool_result_block, *s_tool_call_id, *s_step_start, *s_step_end;

static int
intern_strings(void)
{
#define INTERN(var, text) \
    if (var == NULL && (var = PyUnicode_InternFromString(text)) == NULL) { return -1; }
    INTERN(s_digest, "digest")
    INTERN(s_type, "type") INTERN(s_seq, "seq") INTERN(s_time, "time") INTERN(s_data, "data")
    INTERN(s_seq0, "seq0") INTERN(s_time0, "time0") INTERN(s_turn, "turn")
    INTERN(s_step, "step") INTERN(s_index, "index") INTERN(s_dt, "dt")
    INTERN(s_texts, "texts") INTERN(s_id, "id") INTERN(s_name, "name") INTERN(s_args, "args")
    INTERN(s_chunk, "chunk") INTERN(s_text, "text")
    INTERN(s_arguments_delta, "argumentsDelta")
    INTERN(s_assistant_chunk, "assistant/chunk") INTERN(s_text_chunks, "text-chunks")
    INTERN(s_reasoning_chunks, "reasoning-chunks") INTERN(s_tool_chunks, "tool-call-chunks")
    INTERN(s_text_delta, "text-delta") INTERN(s_reasoning_delta, "reasoning-delta")
    INTERN(s_tool_delta, "tool-call-delta") INTERN(s_reason, "reason") INTERN(s_kind, "kind")
    INTERN(s_trigger, "trigger") INTERN(s_message, "message") INTERN(s_role, "role")
    INTERN(s_content, "content") INTERN(s_source, "source")
    INTERN(s_provenance, "provenance") INTERN(s_call_id, "callId")
    INTERN(s_is_error, "isError") INTERN(s_error, "error") INTERN(s_ignorable, "ignorable")
    INTERN(s_fallback, "fallback") INTERN(s_request_header, "request/header")
    INTERN(s_request_header_delta, "request/header-delta") INTERN(s_mode_set, "mode/set")
    INTERN(s_request_context, "request/context")
    INTERN(s_steering, "steering/message") INTERN(s_turn_start, "turn/start")
    INTERN(s_turn_end, "turn/end") INTERN(s_user_message, "user/message")
    INTERN(s_assistant_message, "assistant/message") INTERN(s_tool_result, "tool/result")
    INTERN(s_end_seed, "session/end-seed") INTERN(s_completed, "completed")
    INTERN(s_blocked, "blocked") INTERN(s_max_tokens, "max-tokens")
    INTERN(s_interrupted, "interrupted") INTERN(s_aborted, "aborted")
    INTERN(s_disposed, "disposed") INTERN(s_error_kind, "error")
    INTERN(s_surface_op, "surfaceOp") INTERN(s_append, "append")
    INTERN(s_source_event_seqs, "sourceEventSeqs")
    INTERN(s_user, "user") INTERN(s_system, "system") INTERN(s_assistant, "assistant")
    INTERN(s_system_message, "system/message") INTERN(s_model, "model")
    INTERN(s_provider, "provider") INTERN(s_tool, "tool")
    INTERN(s_tool_result_block, "tool-result") INTERN(s_tool_call_id, "toolCallId")
    INTERN(s_step_start, "step/start") INTERN(s_step_end, "step/end")
#undef INTERN
    return 0;
}

/* str equality for an exact str against an interned constant. Two distinct interned strings
 * are never equal, and a load pass hands out the constants themselves for the values they
 * equal (str_cache_open), so most checks end at the pointer test. */
static inline int
str_is(PyObject *value, PyObject *constant)
{
    if (value == constant) {
        return 1;
    }
    return value != NULL && PyUnicode_CheckExact(value) && !PyUnicode_CHECK_INTERNED(value)
        && PyUnicode_Compare(value, constant) == 0;
}

/* Start a load pass (see shared_str), its table seeded with the interned constants: an
 * event's type, role or kind then is the constant itself, which str_is, set lookups and dict
 * lookups by these strings answer at the pointer test. -1 (MemoryError) on failure. */
static int
str_cache_open(void)
{
    PyObject *const seeds[] = {
        s_assistant_chunk, s_text_chunks, s_reasoning_chunks, s_tool_chunks, s_text_delta,
        s_reasoning_delta, s_tool_delta, s_fallback, s_request_header, s_request_header_delta,
        s_request_context, s_mode_set, s_steering, s_turn_start, s_turn_end, s_user_message,
        s_assistant_message, s_tool_result, s_end_seed, s_completed, s_blocked, s_max_tokens,
        s_interrupted, s_aborted, s_disposed, s_error_kind, s_append, s_user, s_system,
        s_assistant, s_system_message, s_model, s_provider, s_tool, s_tool_result_block,
        s_text,
        /* keys, so that lookups by these constants end at the pointer test */
        s_type, s_seq, s_time, s_data, s_turn, s_step, s_message, s_role, s_content, s_source,
        s_kind, s_id, s_name, s_surface_op, s_source_event_seqs, s_call_id, s_tool_call_id,
        s_reason, s_index, s_chunk, s_is_error, s_seq0, s_time0, s_dt, s_texts, s_args,
        s_arguments_delta, s_ignorable, s_provenance, s_trigger, s_error};
    size_t k;
    if (str_cache_slots == NULL) {
        str_cache_slots = PyMem_RawCalloc(STR_CACHE_MIN_SLOTS, sizeof(PyObject *));
        str_cache_used = PyMem_RawMalloc(STR_CACHE_MIN_SLOTS / 2 * sizeof(uint32_t));
        if (str_cache_slots == NULL || str_cache_used == NULL) {
            PyMem_RawFree(str_cache_slots);
            PyMem_RawFree(str_cache_used);
            str_cache_slots = NULL;
            str_cache_used = NULL;
            PyErr_NoMemory();
            return -1;
        }
        str_cache_mask = STR_CACHE_MIN_SLOTS - 1;
        str_cache_limit = STR_CACHE_MIN_SLOTS / 2;
    }
    if (cons_slots == NULL) {
        cons_slots = PyMem_RawCalloc(CONS_SLOTS, sizeof(PyObject *));
        cons_hashes = PyMem_RawMalloc(CONS_SLOTS * sizeof(uint64_t));
        cons_used = PyMem_RawMalloc(CONS_SLOTS * sizeof(uint32_t));
        if (cons_slots == NULL || cons_hashes == NULL || cons_used == NULL) {
            PyMem_RawFree(cons_slots);
            PyMem_RawFree(cons_hashes);
            PyMem_RawFree(cons_used);
            cons_slots = NULL;
            cons_hashes = NULL;
            cons_used = NULL;
            PyErr_NoMemory();
            return -1;
        }
    }
    str_cache_close();  /* a pass that ended without closing (none should) leaves nothing */
    str_cache_on = 1;
    pass_gc_off = PyGC_Disable();
    for (k = 0; k < sizeof(seeds) / sizeof(seeds[0]); k++) {
        Py_DECREF(shared_str(seeds[k]));
    }
    return 0;
}

/* 1 when value is an exact int within [lo, max_safe]; never a bool. */
static inline int
safe_int_at_least(PyObject *value, long long lo, long long *out)
{
    int overflow = 0;
    long long v;
    if (value == NULL || !PyLong_CheckExact(value)) {
        return 0;
    }
    v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v < lo || v > max_safe) {
        return 0;
    }
    if (out != NULL) {
        *out = v;
    }
    return 1;
}

static inline int
is_number(PyObject *value)
{
    return value != NULL && (PyLong_CheckExact(value) || PyFloat_CheckExact(value));
}

/* A new plain dict of the members kv (pairs keys and values, in order); NULL on error. */
static PyObject *dict_fill(PyObject *d, PyObject *const *kv, Py_ssize_t pairs);

static PyObject *
dict_of(PyObject *const *kv, Py_ssize_t pairs)
{
#if PY_VERSION_HEX < 0x030D0000
    /* presized: an event's sixth key would resize a plain new dict */
    return dict_fill(_PyDict_NewPresized(pairs), kv, pairs);
#else
    return dict_fill(PyDict_New(), kv, pairs);
#endif
}

/* d (a new empty dict, or NULL) with the members kv inserted; NULL (d released) on error. */
static PyObject *
dict_fill(PyObject *d, PyObject *const *kv, Py_ssize_t pairs)
{
    Py_ssize_t i;
    if (d == NULL) {
        return NULL;
    }
    for (i = 0; i < pairs; i++) {
        if (PyDict_SetItem(d, kv[2 * i], kv[2 * i + 1]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* The last type other than FrozenDict that frozen_of was asked for (held, so its address
 * cannot be reused) and whether a plain dict may be retyped to it (same_layout). */
static PyTypeObject *frozen_of_type = NULL;
static int frozen_of_retype = 0;

/* A new, filled and untracked instance of `type` (a FrozenDict subclass without slots). */
static PyObject *
frozen_of(PyTypeObject *type, PyObject *const *kv, Py_ssize_t pairs)
{
    Py_ssize_t i;
    PyObject *d;
    if (retype_ok && type != frozen_dict_type && type != frozen_of_type) {
        Py_XSETREF(frozen_of_type, (PyTypeObject *)Py_NewRef(type));
        frozen_of_retype = same_layout(type, &PyDict_Type);
    }
    if (retype_ok && (type == frozen_dict_type || frozen_of_retype)) {
        /* a plain new dict retyped, as own_dict does: dict's free list and no generic
         * allocation of a heap subtype (a third of an expanded chunk's cost) */
        int untracked = 1;
        d = dict_of(kv, pairs);
        if (d == NULL) {
            return NULL;
        }
        for (i = 0; i < pairs && untracked; i++) {
            untracked = !is_tracked(kv[2 * i]) && !is_tracked(kv[2 * i + 1]);
        }
        retype(d, type);
        if (untracked) {
            PyObject_GC_UnTrack(d);
        }
        return d;
    }
    d = dict_fill(PyDict_Type.tp_new(type, empty_tuple, NULL), kv, pairs);
    if (d != NULL) {
        untrack_checked(d);
    }
    return d;
}

/* Expand a frozen chunk row like dsh.session.chunks.decode_storage_record. Returns a new
 * list of events, or NULL with Fallback set wherever that function would raise (Python then
 * raises the precise error), or NULL with another error (memory). */
static PyObject *
expand_row(PyObject *row, PyTypeObject *event_type, int tool)
{
    PyObject *seq0_o, *time0_o, *data, *payload, *dt, *turn, *step, *index, *id = NULL,
        *name = NULL, *delta, *out = NULL, *time_o;
    long long seq0, t;
    Py_ssize_t n, k, data_size;

    if (PyDict_GET_SIZE(row) != 4) {
        return fallback();
    }
    seq0_o = PyDict_GetItem(row, s_seq0);
    time0_o = PyDict_GetItem(row, s_time0);
    data = PyDict_GetItem(row, s_data);
    if (!safe_int_at_least(seq0_o, 0, &seq0) || !safe_int_at_least(time0_o, -max_safe, &t)
            || data == NULL || !PyDict_Check(data)) {
        return fallback();
    }
    data_size = PyDict_GET_SIZE(data);
    turn = PyDict_GetItem(data, s_turn);
    step = PyDict_GetItem(data, s_step);
    index = PyDict_GetItem(data, s_index);
    dt = PyDict_GetItem(data, s_dt);
    if (turn == NULL || step == NULL || index == NULL || dt == NULL) {
        return fallback();
    }
    if (tool) {
        id = PyDict_GetItem(data, s_id);
        name = PyDict_GetItem(data, s_name);
        payload = PyDict_GetItem(data, s_args);
        if (data_size != (name != NULL ? 7 : 6) || id == NULL || payload == NULL
                || !PyUnicode_CheckExact(id) || (name != NULL && !PyUnicode_CheckExact(name))) {
            return fallback();
        }
        delta = s_tool_delta;
    }
    else {
        payload = PyDict_GetItem(data, s_texts);
        if (data_size != 5 || payload == NULL) {
            return fallback();
        }
        delta = str_is(PyDict_GetItem(row, s_type), s_text_chunks)
            ? s_text_delta : s_reasoning_delta;
    }
    if (!is_number(turn) || !is_number(step) || !is_number(index) || !PyList_Check(payload)
            || !PyList_Check(dt)) {
        return fallback();
    }
    n = PyList_GET_SIZE(payload);
    if (n == 0 || PyList_GET_SIZE(dt) != n - 1 || seq0 + n - 1 > max_safe) {
        return fallback();
    }
    for (k = 0; k < n; k++) {
        if (!PyUnicode_CheckExact(PyList_GET_ITEM(payload, k))) {
            return fallback();
        }
        if (k < n - 1 && !safe_int_at_least(PyList_GET_ITEM(dt, k), -max_safe, NULL)) {
            return fallback();
        }
    }
    out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    /* a run's chunks mostly share their millisecond: one time int while it does not change */
    time_o = Py_NewRef(time0_o);
    for (k = 0; k < n; k++) {
        PyObject *chunk, *cdata, *event, *seq_o;
        PyObject *piece = PyList_GET_ITEM(payload, k);
        if (k > 0) {
            long long step_ms = PyLong_AsLongLong(PyList_GET_ITEM(dt, k - 1));
            t += step_ms;
            if (t > max_safe || t < -max_safe) {
                Py_DECREF(time_o);
                Py_DECREF(out);
                return fallback();
            }
            if (step_ms != 0) {
                Py_SETREF(time_o, PyLong_FromLongLong(t));
                if (time_o == NULL) {
                    goto error;
                }
            }
        }
        if (tool) {
            PyObject *kv[] = {s_type, delta, s_index, index, s_id, id, s_name, name,
                              s_arguments_delta, piece};
            if (name != NULL) {
                chunk = frozen_shared(kv, 5);
            }
            else {
                PyObject *kv2[] = {s_type, delta, s_index, index, s_id, id,
                                   s_arguments_delta, piece};
                chunk = frozen_shared(kv2, 4);
            }
        }
        else {
            PyObject *kv[] = {s_type, delta, s_index, index, s_text, piece};
            chunk = frozen_shared(kv, 3);
        }
        if (chunk == NULL) {
            goto error;
        }
        {
            PyObject *kv[] = {s_turn, turn, s_step, step, s_chunk, chunk};
            cdata = frozen_shared(kv, 3);
        }
        Py_DECREF(chunk);
        if (cdata == NULL) {
            goto error;
        }
        seq_o = PyLong_FromLongLong(seq0 + k);
        if (seq_o == NULL) {
            Py_DECREF(cdata);
            goto error;
        }
        {
            PyObject *kv[] = {s_type, s_assistant_chunk, s_seq, seq_o, s_time, time_o,
                              s_data, cdata};
            event = frozen_of(event_type, kv, 4);
        }
        Py_DECREF(seq_o);
        Py_DECREF(cdata);
        if (event == NULL) {
            goto error;
        }
        PyList_SET_ITEM(out, k, event);
    }
    Py_DECREF(time_o);
    return out;

error:
    Py_XDECREF(time_o);
    Py_DECREF(out);
    return NULL;
}

/* 1 when data holds a run of 19 or more ASCII digits (a literal that may pass 64 bits) that
 * starts the data or follows a byte that may stand right before a JSON number's integer or
 * exponent digits (number_lead): after any other byte ('"', '.', a letter) the run is inside
 * a string or a fraction's digits; the same conservative test as dsh.json's _LONG_NUMBER
 * scan. */
static inline int
is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static inline int
number_lead(char c)
{
    switch (c) {
    case '-': case '+': case 'e': case 'E': case '[': case ',': case ':':
    case ' ': case '\t': case '\n': case '\r':
        return 1;
    default:
        return 0;
    }
}

static int
has_long_digit_run(const char *p, Py_ssize_t n)
{
    /* Any run of 19 covers p[i + 18] for the first i it could start at: probe there and skip
     * 19 bytes when it is no digit (text mostly), else measure the run around the probe. */
    Py_ssize_t i = 0;
    while (i + 18 < n) {
        Py_ssize_t lo = i + 18, hi = i + 18;
        if (!is_digit(p[lo])) {
            i += 19;
            continue;
        }
        while (lo > i && is_digit(p[lo - 1])) {
            lo--;
        }
        while (hi + 1 < n && is_digit(p[hi + 1])) {
            hi++;
        }
        if (hi - lo + 1 >= 19 && (lo == 0 || number_lead(p[lo - 1]))) {
            return 1;
        }
        i = hi + 1;  /* a run containing no later probe position ends before hi + 1 */
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * The direct parser of a load pass: JSON text straight to the frozen tree that orjson.loads
 * followed by freeze_owned would give, without the intermediate tree. Strings are looked up
 * in the pass's str table from their bytes (a repeated one is never built), keys too, and a
 * nested record is looked up in the cons table from its members before any dict is built.
 * It takes the grammar dsh's writers produce (compact RFC 8259 JSON) and leaves everything
 * else to the orjson path and Python by raising Fallback: whitespace between tokens, a
 * duplicate key, an integer of more than 18 digits or beyond +-max_safe, a float that is
 * non-finite, -0.0 or longer than 63 bytes, a \u escape of a surrogate, a control byte or
 * invalid UTF-8 in a string, nesting deeper than FAST_DEPTH. What it accepts it decodes
 * exactly as orjson (RFC 8259 values; floats correctly rounded by PyOS_string_to_double, as
 * orjson's are), then applies freeze_owned's rules (integral floats become ints).
 * Only while retype_ok: the containers are built as dict/list and retyped, as own_dict does.
 */

/* Values parsed but not yet placed in their container: one stack for the pass, so a record's
 * members are gathered without an allocation per record. */
static PyObject **jp_stack = NULL;
static Py_ssize_t jp_top = 0, jp_cap = 0;

static int
jp_push(PyObject *v)
{
    if (jp_top == jp_cap) {
        Py_ssize_t cap = jp_cap ? 2 * jp_cap : 256;
        PyObject **grown = PyMem_Realloc(jp_stack, (size_t)cap * sizeof(PyObject *));
        if (grown == NULL) {
            Py_DECREF(v);
            PyErr_NoMemory();
            return -1;
        }
        jp_stack = grown;
        jp_cap = cap;
    }
    jp_stack[jp_top++] = v;
    return 0;
}

/* Release the stacked values from index base on (an error, or their refs were copied). */
static void
jp_drop(Py_ssize_t base)
{
    while (jp_top > base) {
        jp_top--;
        Py_DECREF(jp_stack[jp_top]);
    }
}

typedef struct {
    const unsigned char *p;    /* the next byte */
    const unsigned char *end;  /* one past the text */
    int cons;                  /* share nested records (0 in a chunk row: expand_row rebuilds) */
} JParser;

static PyObject *jp_value(JParser *j, int depth);

/* 1 when the next byte is c, then stepped over. */
static inline int
jp_eat(JParser *j, unsigned char c)
{
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

/* In front of the pass's str table, for the ASCII strs of at most 24 bytes of a record (its
 * keys, types, roles, kinds): a small direct-mapped table that holds each entry's bytes as
 * three words, so a hit costs a few compares in cache instead of a hash of the bytes, a probe
 * of the big table and a look at the str. It only points at strs the str table holds (and so
 * keeps alive); emptied when a pass ends (str_cache_close). Little-endian only: a word is
 * masked to the str's bytes by its low bytes. */
#define JP_HOT_SLOTS 512
typedef struct {
    uint64_t w[3];
    Py_ssize_t n;
    PyObject *str;  /* borrowed from the str table; NULL when empty */
} JpHot;
static JpHot jp_hot[JP_HOT_SLOTS];
static int jp_hot_used = 0;

/* The ints of a pass beyond the small-int cache, one object per value while its slot keeps
 * it: an event's time repeats for every event of the same millisecond. Direct-mapped, the
 * newest value kept; emptied when a pass ends. */
#define JP_INT_SLOTS 256
static PyObject *jp_ints[JP_INT_SLOTS];
static long long jp_int_values[JP_INT_SLOTS];
static int jp_ints_used = 0;

static void
jp_hot_clear(void)
{
    if (jp_hot_used) {
        memset(jp_hot, 0, sizeof(jp_hot));
        jp_hot_used = 0;
    }
    if (jp_ints_used) {
        int k;
        for (k = 0; k < JP_INT_SLOTS; k++) {
            Py_CLEAR(jp_ints[k]);
        }
        jp_ints_used = 0;
    }
}

/* The int x (a new reference), shared while a pass runs. */
static PyObject *
jp_int(long long x)
{
    size_t i;
    PyObject *v;
    if (!str_cache_on || (x >= -5 && x <= 256)) {
        return PyLong_FromLongLong(x);  /* small ints are CPython's own shared objects */
    }
    i = (size_t)(((uint64_t)x * 0x9E3779B97F4A7C15ULL) >> 56);
    if (jp_ints[i] != NULL && jp_int_values[i] == x) {
        return Py_NewRef(jp_ints[i]);
    }
    v = PyLong_FromLongLong(x);
    if (v != NULL) {
        Py_XSETREF(jp_ints[i], Py_NewRef(v));
        jp_int_values[i] = x;
        jp_ints_used = 1;
    }
    return v;
}

/* The str of the ASCII bytes s[0:n] (no escapes), the pass's shared one when it has it.
 * readable: bytes that may be read from s (at least n). */
static PyObject *
jp_ascii(const unsigned char *s, Py_ssize_t n, Py_ssize_t readable)
{
    PyObject *x;
    JpHot *hot = NULL;
    uint64_t w[3];
    if (!str_cache_on || n > STR_CACHE_MAX_LEN) {
        goto build;
    }
#if PY_LITTLE_ENDIAN
    if (n <= 24 && readable >= 24) {
        int k;
        memcpy(w, s, 24);
        for (k = 0; k < 3; k++) {
            Py_ssize_t left = n - 8 * k;
            if (left <= 0) {
                w[k] = 0;
            }
            else if (left < 8) {
                w[k] &= ((uint64_t)1 << (8 * left)) - 1;
            }
        }
        hot = &jp_hot[(((w[0] * 0x9E3779B97F4A7C15ULL) ^ (w[1] * 0xC2B2AE3D27D4EB4FULL)
                        ^ (w[2] * 0x165667B19E3779F9ULL) ^ (uint64_t)n) * 0xFF51AFD7ED558CCDULL)
                      >> 55];
        if (hot->str != NULL && hot->n == n && hot->w[0] == w[0] && hot->w[1] == w[1]
                && hot->w[2] == w[2]) {
            return Py_NewRef(hot->str);
        }
    }
#else
    (void)readable;
#endif
    {
        size_t i;
        if (str_cache_count >= str_cache_limit) {
            str_cache_grow();
        }
        for (i = str_cache_index(s, n, PyUnicode_1BYTE_KIND) & str_cache_mask;;
                i = (i + 1) & str_cache_mask) {
            PyObject *slot = str_cache_slots[i];
            if (slot == NULL) {
                x = PyUnicode_New(n, 127);
                if (x == NULL) {
                    return NULL;
                }
                memcpy(PyUnicode_DATA(x), s, (size_t)n);
                if (str_cache_count >= str_cache_limit) {
                    return x;  /* the table is full: neither it nor the hot one keeps x */
                }
                str_cache_slots[i] = Py_NewRef(x);
                str_cache_used[str_cache_count++] = (uint32_t)i;
                break;
            }
            /* a kind-1 str of these bytes (all < 0x80) is ASCII: canonical form */
            if (PyUnicode_GET_LENGTH(slot) == n && PyUnicode_KIND(slot) == PyUnicode_1BYTE_KIND
                    && memcmp(PyUnicode_DATA(slot), s, (size_t)n) == 0) {
                x = Py_NewRef(slot);
                break;
            }
        }
    }
    if (hot != NULL) {
        memcpy(hot->w, w, sizeof(w));
        hot->n = n;
        hot->str = x;
        jp_hot_used = 1;
    }
    return x;
build:
    x = PyUnicode_New(n, 127);
    if (x != NULL) {
        memcpy(PyUnicode_DATA(x), s, (size_t)n);
    }
    return x;
}

static inline int
jp_hex(unsigned char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* A string from j->p (just after its opening quote) to its closing quote; new reference. */
static PyObject *
jp_string(JParser *j)
{
    const unsigned char *s = j->p, *q = s, *end = j->end;
    unsigned char small[256], *out, *o;
    int ascii = 1;
    PyObject *x;
    while (q < end && *q != '"' && *q != '\\' && *q >= 0x20 && *q < 0x80) {
        q++;
    }
    if (q < end && *q == '"') {
        j->p = q + 1;
        return jp_ascii(s, q - s, end - s);
    }
    /* escapes or non-ASCII: find the closing quote, then decode into a buffer no longer
     * than the source text */
    {
        const unsigned char *c = q;
        while (c < end && *c != '"') {
            c += *c == '\\' ? 2 : 1;
        }
        if (c >= end) {
            return fallback();  /* unterminated */
        }
        end = c;  /* the decode below stops at the closing quote */
    }
    out = end - s <= (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc((size_t)(end - s));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(out, s, (size_t)(q - s));
    o = out + (q - s);
    for (;;) {
        unsigned char c;
        if (q >= end) {
            break;  /* at the closing quote */
        }
        c = *q;
        if (c < 0x20) {
            goto fall;  /* a raw control byte: JSON forbids it */
        }
        if (c >= 0x80) {
            ascii = 0;
            *o++ = c;
            q++;
            continue;
        }
        if (c != '\\') {
            *o++ = c;
            q++;
            continue;
        }
        c = q[1];  /* before the closing quote: the scan above stepped over it */
        q += 2;
        if (c != 'u') {
            /* the two-character escapes: \" \\ \/ \b \f \n \r \t */
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *at = memchr(from, c, sizeof(from) - 1);
            if (at == NULL) {
                goto fall;
            }
            *o++ = (unsigned char)to[at - from];
        }
        else {
            int h0, h1, h2, h3;
            unsigned int u;
            if (end - q < 4 || (h0 = jp_hex(q[0])) < 0 || (h1 = jp_hex(q[1])) < 0
                    || (h2 = jp_hex(q[2])) < 0 || (h3 = jp_hex(q[3])) < 0) {
                goto fall;
            }
            u = (unsigned int)((h0 << 12) | (h1 << 8) | (h2 << 4) | h3);
            q += 4;
            if (u >= 0xD800 && u <= 0xDFFF) {
                goto fall;  /* surrogates (paired or lone): Python judges them */
            }
            /* as UTF-8: 6 source bytes become at most 3 */
            if (u < 0x80) {
                *o++ = (unsigned char)u;
            }
            else if (u < 0x800) {
                ascii = 0;
                *o++ = (unsigned char)(0xC0 | (u >> 6));
                *o++ = (unsigned char)(0x80 | (u & 0x3F));
            }
            else {
                ascii = 0;
                *o++ = (unsigned char)(0xE0 | (u >> 12));
                *o++ = (unsigned char)(0x80 | ((u >> 6) & 0x3F));
                *o++ = (unsigned char)(0x80 | (u & 0x3F));
            }
        }
    }
    j->p = end + 1;
    if (ascii) {
        x = jp_ascii(out, o - out, o - out);
    }
    else {
        /* strict: invalid UTF-8, and surrogates encoded in it, are refused (Python judges) */
        PyObject *decoded = PyUnicode_DecodeUTF8((const char *)out, o - out, "strict");
        if (decoded == NULL) {
            if (out != small) {
                PyMem_Free(out);
            }
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                return fallback();
            }
            return NULL;
        }
        x = shared_str(decoded);
        Py_DECREF(decoded);
    }
    if (out != small) {
        PyMem_Free(out);
    }
    return x;
fall:
    if (out != small) {
        PyMem_Free(out);
    }
    return fallback();
}

/* The end of the run of digits at q, or NULL when q holds none. */
static inline const unsigned char *
jp_digits(const unsigned char *q, const unsigned char *end)
{
    const unsigned char *d = q;
    while (d < end && *d >= '0' && *d <= '9') {
        d++;
    }
    return d > q ? d : NULL;
}

/* A number from j->p; freeze_owned's rules applied (safe ints, integral floats as ints). */
static PyObject *
jp_number(JParser *j)
{
    const unsigned char *s = j->p, *q = s, *end = j->end, *digits;
    int is_float = 0;
    if (q < end && *q == '-') {
        q++;
    }
    digits = q;
    if (q < end && *q == '0') {
        q++;
    }
    else if (q < end && *q >= '1' && *q <= '9') {
        q = jp_digits(q, end);
    }
    else {
        return fallback();
    }
    if (q < end && *q == '.') {
        q = jp_digits(q + 1, end);
        if (q == NULL) {
            return fallback();
        }
        is_float = 1;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-')) {
            q++;
        }
        q = jp_digits(q, end);
        if (q == NULL) {
            return fallback();
        }
        is_float = 1;
    }
    j->p = q;
    if (!is_float) {
        long long x = 0;
        const unsigned char *d;
        if (q - digits > 18) {
            return fallback();
        }
        for (d = digits; d < q; d++) {
            x = 10 * x + (*d - '0');
        }
        if (x > max_safe) {
            return fallback();
        }
        return jp_int(digits != s ? -x : x);
    }
    {
        char buf[64];
        char *stop;
        double v;
        if (q - s >= (Py_ssize_t)sizeof(buf)) {
            return fallback();
        }
        memcpy(buf, s, (size_t)(q - s));
        buf[q - s] = '\0';
        v = PyOS_string_to_double(buf, &stop, NULL);  /* correctly rounded; +-inf on overflow */
        if (v == -1.0 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_MemoryError)) {
                return NULL;
            }
            PyErr_Clear();
            return fallback();
        }
        if (stop != buf + (q - s) || !isfinite(v) || (v == 0.0 && signbit(v))) {
            return fallback();
        }
        /* JavaScript has one number type and dsh writes 5, not 5.0 (as walk does) */
        if (v == floor(v) && fabs(v) <= (double)max_safe) {
            return PyLong_FromLongLong((long long)v);
        }
        return PyFloat_FromDouble(v);
    }
}

/* An object from j->p (just after its '{'); a new FrozenDict (untracked when every member
 * is), or the cons table's equal record when nested and shareable (own_dict's rules). */
static PyObject *
jp_object(JParser *j, int depth)
{
    Py_ssize_t base = jp_top, pairs;
    PyObject *d, **kv;
    int all_untracked = 1, found = 0;
    Py_ssize_t slot = -1;
    uint64_t h = 0;
    if (!jp_eat(j, '}')) {
        for (;;) {
            PyObject *key, *value;
            if (!jp_eat(j, '"')) {
                goto fall;
            }
            key = jp_string(j);
            if (key == NULL || jp_push(key) < 0) {
                goto fail;
            }
            if (!jp_eat(j, ':')) {
                goto fall;
            }
            value = jp_value(j, depth + 1);
            if (value == NULL || jp_push(value) < 0) {
                goto fail;
            }
            if (all_untracked && is_tracked(value)) {
                all_untracked = 0;
            }
            /* a chunk row's records are rebuilt by expand_row: sharing them is work lost */
            if (depth == 0 && is_chunk_row_tag(value) && PyUnicode_GET_LENGTH(key) == 4
                    && memcmp(PyUnicode_DATA(key), "type", 4) == 0) {
                j->cons = 0;
            }
            if (jp_eat(j, ',')) {
                continue;
            }
            if (jp_eat(j, '}')) {
                break;
            }
            goto fall;
        }
    }
    pairs = (jp_top - base) / 2;
    kv = jp_stack + base;
    if (depth > 0 && j->cons && all_untracked && pairs <= CONS_MAX_PAIRS
            && cons_hash_kv(kv, pairs, &h)) {
        slot = cons_slot(kv, pairs, h, &found);
        if (found) {
            d = Py_NewRef(cons_slots[slot]);
            jp_drop(base);
            return d;
        }
    }
    d = dict_of(kv, pairs);
    if (d == NULL) {
        goto fail;
    }
    jp_drop(base);
    if (PyDict_GET_SIZE(d) != pairs) {
        Py_DECREF(d);  /* a duplicate key: Python judges the record */
        return fallback();
    }
    retype(d, frozen_dict_type);
    if (all_untracked) {
        PyObject_GC_UnTrack(d);
        if (slot >= 0) {
            cons_keep(slot, h, d);
        }
    }
    return d;
fall:
    jp_drop(base);
    return fallback();
fail:
    jp_drop(base);
    return NULL;
}

/* An array from j->p (just after its '['); a new FrozenList (untracked when every item is). */
static PyObject *
jp_array(JParser *j, int depth)
{
    Py_ssize_t base = jp_top, n, k;
    PyObject *l;
    int all_untracked = 1;
    if (!jp_eat(j, ']')) {
        for (;;) {
            PyObject *value = jp_value(j, depth + 1);
            if (value == NULL || jp_push(value) < 0) {
                jp_drop(base);
                return NULL;
            }
            if (all_untracked && is_tracked(value)) {
                all_untracked = 0;
            }
            if (jp_eat(j, ',')) {
                continue;
            }
            if (jp_eat(j, ']')) {
                break;
            }
            jp_drop(base);
            return fallback();
        }
    }
    n = jp_top - base;
    l = PyList_New(n);
    if (l == NULL) {
        jp_drop(base);
        return NULL;
    }
    for (k = 0; k < n; k++) {
        PyList_SET_ITEM(l, k, jp_stack[base + k]);  /* the stack's reference moves */
    }
    jp_top = base;
    retype(l, frozen_list_type);
    if (all_untracked) {
        PyObject_GC_UnTrack(l);
    }
    return l;
}

static PyObject *
jp_value(JParser *j, int depth)
{
    const unsigned char *p = j->p;
    Py_ssize_t left = j->end - p;
    if (left <= 0) {
        return fallback();
    }
    switch (*p) {
    case '"':
        j->p++;
        return jp_string(j);
    case '{':
        j->p++;
        return depth > FAST_DEPTH ? fallback() : jp_object(j, depth);
    case '[':
        j->p++;
        return depth > FAST_DEPTH ? fallback() : jp_array(j, depth);
    case 't':
        if (left >= 4 && memcmp(p, "true", 4) == 0) {
            j->p += 4;
            Py_RETURN_TRUE;
        }
        return fallback();
    case 'f':
        if (left >= 5 && memcmp(p, "false", 5) == 0) {
            j->p += 5;
            Py_RETURN_FALSE;
        }
        return fallback();
    case 'n':
        if (left >= 4 && memcmp(p, "null", 4) == 0) {
            j->p += 4;
            Py_RETURN_NONE;
        }
        return fallback();
    default:
        return jp_number(j);
    }
}

/* The frozen value of the whole JSON text p[0:n] as freeze_owned(orjson.loads(text)) gives
 * it, or NULL with Fallback (anything the direct parser leaves to the orjson path) or another
 * error. Only while retype_ok. */
static PyObject *
jp_parse(const char *p, Py_ssize_t n)
{
    JParser j = {(const unsigned char *)p, (const unsigned char *)p + n, 1};
    PyObject *v = jp_value(&j, 0);
    if (v != NULL && j.p != j.end) {
        Py_DECREF(v);
        return fallback();  /* trailing bytes (or whitespace): Python judges */
    }
    return v;
}

/* Decode one record line into a new Event (a plain record) or a new list of events (a chunk
 * row), or NULL with Fallback set when Python must judge the line (any error, any unusual
 * value), or NULL with another error. */
static PyObject *
decode_line(const char *p, Py_ssize_t n, PyObject *loads, PyTypeObject *event_type,
            int event_retype)
{
    PyObject *raw, *parsed, *frozen, *tag, *out;
    if (n == 0 || has_long_digit_run(p, n)) {
        return fallback();
    }
    if (retype_ok) {
        frozen = p[0] == '{' ? jp_parse(p, n) : fallback();
        if (frozen == NULL && PyErr_ExceptionMatches(Fallback)) {
            PyErr_Clear();  /* the orjson path decides (and hands Python what it refuses) */
        }
        else if (frozen == NULL) {
            return NULL;
        }
        else {
            goto parsed;
        }
    }
    /* a bytes copy of the line: one small allocation and a memcpy cost a third of what a
     * memoryview over the buffer does (its managed buffer and view are two tracked objects) */
    raw = PyBytes_FromStringAndSize(p, n);
    if (raw == NULL) {
        return NULL;
    }
    parsed = PyObject_CallOneArg(loads, raw);
    Py_DECREF(raw);
    if (parsed == NULL) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError)) {
            return NULL;
        }
        return fallback();  /* malformed, surrogate escapes, too deep: Python decides */
    }
    if (!PyDict_CheckExact(parsed)) {
        Py_DECREF(parsed);
        return fallback();
    }
    /* a chunk row's members are rebuilt by expand_row (which shares its records): sharing
     * the row's own records first would be work thrown away */
    own_cons = !is_chunk_row_tag(PyDict_GetItem(parsed, s_type));
    frozen = freeze_owned(parsed);
    own_cons = 1;
    if (frozen == NULL) {
        return NULL;
    }
parsed:
    tag = PyDict_GetItem(frozen, s_type);
    if (tag == NULL || !PyUnicode_CheckExact(tag)) {
        /* not an event record: Python judges it (torn tail or corruption) */
        Py_DECREF(frozen);
        return fallback();
    }
    if ((str_is(tag, s_text_chunks) || str_is(tag, s_reasoning_chunks)
                || str_is(tag, s_tool_chunks))) {
        out = expand_row(frozen, event_type, str_is(tag, s_tool_chunks));
        Py_DECREF(frozen);
        return out;
    }
    if (event_retype && Py_REFCNT(frozen) == 1 && Py_TYPE(frozen) == frozen_dict_type) {
        retype(frozen, event_type);
        return frozen;
    }
    {
        PyObject *event = PyDict_Type.tp_new(event_type, empty_tuple, NULL);
        if (event == NULL || PyDict_Merge(event, frozen, 1) < 0) {
            Py_XDECREF(event);
            Py_DECREF(frozen);
            return NULL;
        }
        Py_DECREF(frozen);
        untrack_checked(event);
        return event;
    }
}

static int legacy_plain(PyObject *ev);

/* The stored_prescan verdict on one event: record its index in *legacy_at / *unknown_at when
 * it is the first of its kind. -1 on error. */
static int
prescan_one(PyObject *ev, Py_ssize_t index, PyObject *known, Py_ssize_t *legacy_at,
            Py_ssize_t *unknown_at)
{
    if (*legacy_at < 0 && !legacy_plain(ev)) {
        *legacy_at = index;
    }
    if (*unknown_at < 0) {
        PyObject *etype = PyDict_GetItem(ev, s_type);
        int found = etype != NULL && PyUnicode_CheckExact(etype)
            ? PySet_Contains(known, etype) : 0;
        if (found < 0) {
            return -1;
        }
        if (!found && PyDict_GetItem(ev, s_ignorable) != Py_True) {
            *unknown_at = index;
        }
    }
    return 0;
}

/* prescan_one over the count events items, the first at index first. */
static int
prescan_events(PyObject *const *items, Py_ssize_t count, Py_ssize_t first, PyObject *known,
               Py_ssize_t *legacy_at, Py_ssize_t *unknown_at)
{
    Py_ssize_t m;
    if (*legacy_at >= 0 && *unknown_at >= 0) {
        return 0;
    }
    for (m = 0; m < count; m++) {
        if (prescan_one(items[m], first + m, known, legacy_at, unknown_at) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Write what a pass noted back into its prescan list [legacy_at, unknown_at]; -1 on error. */
static int
prescan_store(PyObject *prescan, Py_ssize_t legacy_at, Py_ssize_t unknown_at)
{
    PyObject *legacy_o = PyLong_FromSsize_t(legacy_at);
    PyObject *unknown_o = PyLong_FromSsize_t(unknown_at);
    if (legacy_o == NULL || unknown_o == NULL) {
        Py_XDECREF(legacy_o);
        Py_XDECREF(unknown_o);
        return -1;
    }
    PyList_SetItem(prescan, 0, legacy_o);  /* steals */
    PyList_SetItem(prescan, 1, unknown_o);
    return 0;
}

PyDoc_STRVAR(scan_lines_doc,
"scan_lines(buf, pos, expected, line, loads, event_type, events, first_seqs, first_lines,\n"
"           known_types, prescan, /) -> (pos, line, expected)\n\n"
"The common case of the JSONL scanner (dsh.persistence._jsonl_format.Scanner): from byte pos\n"
"of buf, decode complete lines while each is a well-formed record (orjson `loads`, numbers\n"
"checked, frozen, chunk rows expanded) whose events are Events with seqs expected,\n"
"expected + 1, ... Their events go to `events`, each line's first seq and line number to\n"
"`first_seqs` / `first_lines` (array('q'): two machine ints a line, not two int objects, for\n"
"the duplicate-seq message alone; added with one frombytes call each). Stops before the first line without a newline or that Python\n"
"must judge (malformed, a long number, a surrogate, a bad row, a seq that does not\n"
"continue), and returns where it stopped, the last line number used and the next seq.\n"
"expected < 0: lines picked out of a checked range (not contiguous), each taken at its own\n"
"seq (a chunk row's members still contiguous); the caller checks the seqs, -1 is returned.\n"
"prescan is [legacy_at, unknown_at] over `events` as stored_prescan(events, known_types)\n"
"would answer for the events added here (updated in place while they are still hot), or\n"
"None (nothing noted).");

static PyObject *
scan_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t pos, line;
    long long expected;
    PyObject *loads, *events, *first_seqs, *first_lines, *known, *prescan, *result = NULL;
    long long *noted = NULL;  /* (first seq, line) of every accepted line, for first_seqs/lines */
    Py_ssize_t noted_count = 0, noted_cap = 0;
    PyTypeObject *event_type;
    const char *base;
    int event_retype;
    Py_ssize_t legacy_at, unknown_at;

    if (!configured()) {
        return NULL;
    }
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "scan_lines() takes exactly 11 arguments");
        return NULL;
    }
    pos = PyLong_AsSsize_t(args[1]);
    expected = PyLong_AsLongLong(args[2]);
    line = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    loads = args[4];
    if (!PyType_Check(args[5]) || !PyType_IsSubtype((PyTypeObject *)args[5], frozen_dict_type)
            || !PyList_CheckExact(args[6]) || !PyAnySet_Check(args[9])
            || !(args[10] == Py_None
                 || (PyList_CheckExact(args[10]) && PyList_GET_SIZE(args[10]) == 2))) {
        PyErr_SetString(PyExc_TypeError, "scan_lines(): bad argument types");
        return NULL;
    }
    known = args[9];
    prescan = args[10];
    legacy_at = unknown_at = 0;  /* None: nothing to note (both count as found) */
    if (prescan != Py_None) {
        legacy_at = PyLong_AsSsize_t(PyList_GET_ITEM(prescan, 0));
        unknown_at = PyLong_AsSsize_t(PyList_GET_ITEM(prescan, 1));
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    event_type = (PyTypeObject *)args[5];
    event_retype = retype_ok && same_layout(event_type, &PyDict_Type);
    events = args[6];
    first_seqs = args[7];
    first_lines = args[8];
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    base = (const char *)view.buf;
    if (str_cache_open() < 0) {
        goto done;
    }
    if (pos < 0 || pos > view.len) {
        PyErr_SetString(PyExc_ValueError, "scan_lines(): pos out of range");
        goto done;
    }
    while (pos < view.len) {
        const char *start = base + pos;
        const char *nl = memchr(start, '\n', (size_t)(view.len - pos));
        PyObject *decoded, **items;
        Py_ssize_t k, count;
        long long first;
        if (nl == NULL) {
            break;
        }
        decoded = decode_line(start, nl - start, loads, event_type, event_retype);
        if (decoded == NULL) {
            if (PyErr_ExceptionMatches(Fallback)) {
                PyErr_Clear();
                break;
            }
            goto done;
        }
        /* a plain record is its one event; a chunk row, the list of its members */
        if (PyList_CheckExact(decoded)) {
            count = PyList_GET_SIZE(decoded);
            items = ((PyListObject *)decoded)->ob_item;
        }
        else {
            count = 1;
            items = &decoded;
        }
        first = expected;
        for (k = 0; k < count; k++) {
            long long seq;
            PyObject *ev = items[k];
            if (Py_TYPE(ev) != event_type
                    || !safe_int_at_least(PyDict_GetItem(ev, s_seq), 0, &seq)) {
                break;
            }
            if (k == 0 && expected < 0) {
                first = seq;  /* a picked line: taken at its own seq */
            }
            if (seq != first + k) {
                break;
            }
        }
        if (k < count) {
            Py_DECREF(decoded);
            break;  /* Python names the gap, duplicate or bad record */
        }
        if (noted_count == noted_cap) {
            long long *grown;
            noted_cap = noted_cap ? 2 * noted_cap : 1024;
            grown = PyMem_Realloc(noted, (size_t)noted_cap * 2 * sizeof(long long));
            if (grown == NULL) {
                PyErr_NoMemory();
                Py_DECREF(decoded);
                goto done;
            }
            noted = grown;
        }
        noted[2 * noted_count] = first;
        noted[2 * noted_count + 1] = (long long)line + 1;
        noted_count++;
        k = PyList_GET_SIZE(events);
        if (prescan_events(items, count, k, known, &legacy_at, &unknown_at) < 0) {
            Py_DECREF(decoded);
            goto done;
        }
        if ((PyList_CheckExact(decoded) ? PyList_SetSlice(events, k, k, decoded)
                                        : PyList_Append(events, decoded)) < 0) {
            Py_DECREF(decoded);
            goto done;
        }
        Py_DECREF(decoded);
        if (expected >= 0) {
            expected += count;
        }
        line += 1;
        pos = (nl - base) + 1;
    }
    if (prescan != Py_None && prescan_store(prescan, legacy_at, unknown_at) < 0) {
        goto done;
    }
    if (noted_count > 0) {
        Py_ssize_t i;
        PyObject *column = PyBytes_FromStringAndSize(NULL, noted_count * (Py_ssize_t)sizeof(long long)),
            *added;
        long long *cells;
        if (column == NULL) {
            goto done;
        }
        cells = (long long *)PyBytes_AS_STRING(column);
        for (i = 0; i < noted_count; i++) {
            cells[i] = noted[2 * i];
        }
        added = PyObject_CallMethod(first_seqs, "frombytes", "O", column);
        if (added != NULL) {
            Py_DECREF(added);
            for (i = 0; i < noted_count; i++) {
                cells[i] = noted[2 * i + 1];
            }
            added = PyObject_CallMethod(first_lines, "frombytes", "O", column);
        }
        Py_DECREF(column);
        if (added == NULL) {
            goto done;
        }
        Py_DECREF(added);
    }
    result = Py_BuildValue("(nnL)", pos, line, expected);
done:
    str_cache_close();
    PyMem_Free(noted);
    PyBuffer_Release(&view);
    return result;
}

/* 1 when dsh.persistence.legacy.normalize_legacy_events would return `ev` unchanged without
 * raising (mirrors its per-type rules; anything doubtful is 0). */
static int
legacy_plain(PyObject *ev)
{
    PyObject *etype = PyDict_GetItem(ev, s_type);
    PyObject *data;
    if (etype == NULL || !PyUnicode_CheckExact(etype)) {
        return 1;
    }
    if (str_is(etype, s_request_header_delta) || str_is(etype, s_mode_set)
            || str_is(etype, s_steering)) {
        return 0;
    }
    data = PyDict_GetItem(ev, s_data);
    if (data == NULL || !PyDict_Check(data)) {
        return 1;  /* every rule reads a dict payload; others pass through unchanged */
    }
    if (str_is(etype, s_request_header)) {
        PyObject *reason = PyDict_GetItem(data, s_reason);
        return !str_is(reason, s_fallback);
    }
    if (str_is(etype, s_turn_start)) {
        return PyDict_GetItem(data, s_trigger) == NULL;
    }
    if (str_is(etype, s_turn_end)) {
        PyObject *reason = PyDict_GetItem(data, s_reason), *kind;
        if (PyDict_GET_SIZE(data) != 2 || reason == NULL || !PyDict_Check(reason)
                || !safe_int_at_least(PyDict_GetItem(data, s_turn), 1, NULL)) {
            return 0;
        }
        kind = PyDict_GetItem(reason, s_kind);
        if (kind == NULL || !PyUnicode_CheckExact(kind)) {
            return 0;
        }
        if (str_is(kind, s_completed) || str_is(kind, s_blocked) || str_is(kind, s_max_tokens)
                || str_is(kind, s_interrupted)) {
            return PyDict_GET_SIZE(reason) == 1;
        }
        if (str_is(kind, s_aborted)) {
            return PyDict_GetItem(reason, s_reason) != NULL;
        }
        if (str_is(kind, s_error_kind)) {
            return PyDict_GetItem(reason, s_error) != NULL;
        }
        return !str_is(kind, s_disposed);
    }
    if (str_is(etype, s_user_message)) {
        return !(PyDict_GetItem(data, s_id) == NULL && PyDict_GetItem(data, s_role) == NULL
                 && PyDict_GetItem(data, s_message) == NULL
                 && PyDict_GetItem(data, s_content) != NULL
                 && PyDict_GetItem(data, s_source) != NULL);
    }
    if (str_is(etype, s_assistant_message)) {
        return !(PyDict_GetItem(data, s_message) == NULL
                 && PyDict_GetItem(data, s_content) != NULL
                 && PyDict_GetItem(data, s_provenance) != NULL);
    }
    if (str_is(etype, s_tool_result)) {
        return !(PyDict_GetItem(data, s_message) == NULL
                 && PyDict_GetItem(data, s_call_id) != NULL
                 && PyDict_GetItem(data, s_content) != NULL
                 && PyDict_GetItem(data, s_is_error) != NULL);
    }
    return 1;
}

PyDoc_STRVAR(stored_prescan_doc,
"stored_prescan(events, known_types, /) -> (legacy_at, unknown_at)\n\n"
"One pass over stored events (dicts) for the cold-read pipeline: the index of the first\n"
"event that legacy normalisation might rewrite or refuse (-1: none; the log needs no\n"
"normalisation), and the index of the first event whose type is not in known_types and\n"
"that is not marked ignorable: true (-1: none).");

static PyObject *
stored_prescan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i, n, legacy_at = -1, unknown_at = -1;
    PyObject **items;
    if (!configured()) {
        return NULL;
    }
    if (nargs != 2 || !(PyList_CheckExact(args[0]) || PyTuple_CheckExact(args[0]))
            || !PyAnySet_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "stored_prescan(list | tuple, frozenset)");
        return NULL;
    }
    n = PySequence_Fast_GET_SIZE(args[0]);
    items = PySequence_Fast_ITEMS(args[0]);
    for (i = 0; i < n && (legacy_at < 0 || unknown_at < 0); i++) {
        PyObject *ev = items[i];
        if (!PyDict_Check(ev)) {
            return Py_BuildValue("(nn)", legacy_at < 0 ? i : legacy_at,
                                 unknown_at < 0 ? i : unknown_at);
        }
        if (prescan_one(ev, i, args[1], &legacy_at, &unknown_at) < 0) {
            return NULL;
        }
    }
    return Py_BuildValue("(nn)", legacy_at, unknown_at);
}

/* Decode a schema-17 varint provenance BLOB like decode_source_event_seqs; NULL with Fallback
 * set wherever that function raises. */
static PyObject *
varint_seqs(PyObject *blob)
{
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(blob);
    Py_ssize_t size = PyBytes_GET_SIZE(blob), pos = 0, count = 0;
    long long prev = 0;
    PyObject *out = PyList_New(0), *list;
    if (out == NULL) {
        return NULL;
    }
    while (pos < size) {
        unsigned long long n = 0;
        int shift = 0;
        long long value;
        for (;;) {
            unsigned char byte;
            if (pos >= size || shift > 56) {
                Py_DECREF(out);
                return fallback();
            }
            byte = p[pos++];
            n |= (unsigned long long)(byte & 0x7F) << shift;
            if ((byte & 0x80) == 0) {
                if (byte == 0 && shift > 0) {
                    Py_DECREF(out);
                    return fallback();
                }
                break;
            }
            shift += 7;
        }
        if (count == 0) {
            if (n > (unsigned long long)max_safe) {
                Py_DECREF(out);
                return fallback();
            }
            value = (long long)n;
        }
        else {
            if (n > 2ULL * (unsigned long long)max_safe) {
                Py_DECREF(out);
                return fallback();
            }
            value = n % 2 == 0 ? prev + (long long)(n / 2) : prev - (long long)((n + 1) / 2);
        }
        if (value < 0 || value > max_safe) {
            Py_DECREF(out);
            return fallback();
        }
        {
            PyObject *v = PyLong_FromLongLong(value);
            if (v == NULL || PyList_Append(out, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(v);
        }
        prev = value;
        count++;
    }
    list = new_frozen_list(count);
    if (list == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    for (pos = 0; pos < count; pos++) {
        PyList_SET_ITEM(list, pos, Py_NewRef(PyList_GET_ITEM(out, pos)));
    }
    Py_DECREF(out);
    untrack_checked(list);
    return list;
}

/* JSON text column -> frozen value, or NULL with Fallback (a long literal, a surrogate, any
 * decode error or unusual value: Python's decoder judges it). */
static PyObject *
decode_text(PyObject *text, PyObject *loads, Py_ssize_t limit)
{
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &n);
    PyObject *parsed;
    if (utf8 == NULL) {
        PyErr_Clear();  /* lone surrogates */
        return fallback();
    }
    if ((limit >= 0 && n > limit) || has_long_digit_run(utf8, n)) {
        return fallback();
    }
    if (retype_ok) {
        parsed = jp_parse(utf8, n);
        if (parsed != NULL || !PyErr_ExceptionMatches(Fallback)) {
            return parsed;
        }
        PyErr_Clear();  /* the orjson path decides (and hands Python what it refuses) */
    }
    parsed = PyObject_CallOneArg(loads, text);
    if (parsed == NULL) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError)) {
            return NULL;
        }
        return fallback();
    }
    return freeze_owned(parsed);
}

/* One physical row -> a new Event (a plain row) or a new list of events (a packed row), or
 * NULL with Fallback set where dsh.persistence._sqlite_schema.decode_row must judge the row. */
static PyObject *
decode_one_row(PyObject *row, PyObject *loads, PyTypeObject *event_type, int varints,
               Py_ssize_t packed_limit, Py_ssize_t min_members, Py_ssize_t max_members)
{
    PyObject *seq, *etype, *time, *data, *ses, *sop, *ign, *payload, *out;
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 8) {
        return fallback();
    }
    seq = PyTuple_GET_ITEM(row, 1);
    etype = PyTuple_GET_ITEM(row, 2);
    time = PyTuple_GET_ITEM(row, 3);
    data = PyTuple_GET_ITEM(row, 4);
    ses = PyTuple_GET_ITEM(row, 5);
    sop = PyTuple_GET_ITEM(row, 6);
    ign = PyTuple_GET_ITEM(row, 7);
    if (!safe_int_at_least(seq, 0, NULL) || !PyUnicode_CheckExact(etype)
            || PyUnicode_GET_LENGTH(etype) == 0 || !safe_int_at_least(time, -max_safe, NULL)
            || !PyUnicode_CheckExact(data)) {
        return fallback();
    }
    if (ign != Py_None) {
        /* a packed row: ignorable = 0, a chunk tag, no surface fields, TEXT data */
        long long flag;
        PyObject *record;
        int tool;
        if (!safe_int_at_least(ign, 0, &flag) || flag != 0 || ses != Py_None || sop != Py_None
                || !(str_is(etype, s_text_chunks) || str_is(etype, s_reasoning_chunks)
                     || str_is(etype, s_tool_chunks))) {
            return fallback();
        }
        tool = str_is(etype, s_tool_chunks);
        payload = decode_text(data, loads, packed_limit);
        if (payload == NULL) {
            return NULL;
        }
        {
            PyObject *kv[] = {s_type, etype, s_seq0, seq, s_time0, time, s_data, payload};
            record = frozen_of(frozen_dict_type, kv, 4);
        }
        Py_DECREF(payload);
        if (record == NULL) {
            return NULL;
        }
        out = expand_row(record, event_type, tool);
        Py_DECREF(record);
        if (out != NULL && (PyList_GET_SIZE(out) < min_members
                            || PyList_GET_SIZE(out) > max_members)) {
            Py_DECREF(out);
            return fallback();
        }
        return out;
    }
    if (sop != Py_None && !(PyUnicode_CheckExact(sop)
                            && PyUnicode_CompareWithASCIIString(sop, "\"append\"") == 0)) {
        return fallback();  /* a replace op: Python parses it */
    }
    if (ses != Py_None && !(varints && PyBytes_CheckExact(ses))) {
        return fallback();
    }
    payload = decode_text(data, loads, -1);
    if (payload == NULL) {
        return NULL;
    }
    {
        /* the type column's str is the row's own: shared, it is stored once and is the
         * interned constant the checks after the decode compare by pointer */
        PyObject *seqs = NULL, *event, *kv[12], *shared_type = shared_str(etype);
        Py_ssize_t pairs = 4;
        kv[0] = s_type; kv[1] = shared_type; kv[2] = s_seq; kv[3] = seq; kv[4] = s_time;
        kv[5] = time; kv[6] = s_data; kv[7] = payload;
        if (ses != Py_None) {
            seqs = varint_seqs(ses);
            if (seqs == NULL) {
                Py_DECREF(shared_type);
                Py_DECREF(payload);
                return NULL;
            }
            kv[2 * pairs] = s_source_event_seqs;
            kv[2 * pairs + 1] = seqs;
            pairs++;
        }
        if (sop != Py_None) {
            kv[2 * pairs] = s_surface_op;
            kv[2 * pairs + 1] = s_append;
            pairs++;
        }
        event = frozen_of(event_type, kv, pairs);
        Py_DECREF(shared_type);
        Py_XDECREF(seqs);
        Py_DECREF(payload);
        return event;
    }
}

PyDoc_STRVAR(decode_rows_doc,
"decode_rows(rows, i, expected, loads, event_type, events, varints, packed_limit,\n"
"            min_members, max_members[, known_types, prescan], /) -> (i, expected)\n\n"
"The common case of dsh.persistence._sqlite_schema.scan_rows: from index i, decode rows while\n"
"each is a plain scalar row (TEXT data, surface op NULL or \"append\", provenance NULL or, with\n"
"varints, a canonical varint BLOB) or a packed TEXT chunk row, and its events continue at seq\n"
"expected. Events go to `events`. Stops before the first row Python must judge and returns\n"
"its index and the next seq. Two optional arguments, known_types and prescan, note the read\n"
"pipeline's prescan over `events` while each event is hot, as scan_lines does. expected < 0:\n"
"rows picked out of a checked range, each taken at its own seq (the caller checks them).");

static PyObject *
decode_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *rows, *loads, *events, *known = NULL, *prescan = Py_None;
    PyTypeObject *event_type;
    Py_ssize_t i, n, packed_limit, min_members, max_members;
    Py_ssize_t legacy_at = 0, unknown_at = 0;  /* no prescan: nothing to note */
    long long expected;
    int varints;
    if (!configured()) {
        return NULL;
    }
    if ((nargs != 10 && nargs != 12) || !PyList_CheckExact(args[0]) || !PyType_Check(args[4])
            || !PyList_CheckExact(args[5])
            || (nargs == 12 && (!PyAnySet_Check(args[10]) || !(args[11] == Py_None
                || (PyList_CheckExact(args[11]) && PyList_GET_SIZE(args[11]) == 2))))) {
        PyErr_SetString(PyExc_TypeError, "decode_rows(): bad arguments");
        return NULL;
    }
    if (nargs == 12 && args[11] != Py_None) {
        known = args[10];
        prescan = args[11];
        legacy_at = PyLong_AsSsize_t(PyList_GET_ITEM(prescan, 0));
        unknown_at = PyLong_AsSsize_t(PyList_GET_ITEM(prescan, 1));
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    rows = args[0];
    i = PyLong_AsSsize_t(args[1]);
    expected = PyLong_AsLongLong(args[2]);
    loads = args[3];
    event_type = (PyTypeObject *)args[4];
    events = args[5];
    varints = PyObject_IsTrue(args[6]);
    packed_limit = PyLong_AsSsize_t(args[7]);
    min_members = PyLong_AsSsize_t(args[8]);
    max_members = PyLong_AsSsize_t(args[9]);
    if (PyErr_Occurred() || varints < 0) {
        return NULL;
    }
    n = PyList_GET_SIZE(rows);
    if (str_cache_open() < 0) {
        return NULL;
    }
    for (; i >= 0 && i < n; i++) {
        PyObject *decoded = decode_one_row(PyList_GET_ITEM(rows, i), loads, event_type,
                                           varints, packed_limit, min_members, max_members);
        PyObject **items;
        Py_ssize_t count, end;
        long long first;
        if (decoded == NULL) {
            if (PyErr_ExceptionMatches(Fallback)) {
                PyErr_Clear();
                break;
            }
            str_cache_close();
            return NULL;
        }
        /* a plain row is its one event; a packed row, the list of its members */
        if (PyList_CheckExact(decoded)) {
            count = PyList_GET_SIZE(decoded);
            items = ((PyListObject *)decoded)->ob_item;
        }
        else {
            count = 1;
            items = &decoded;
        }
        if (!safe_int_at_least(PyDict_GetItem(items[0], s_seq), 0, &first)
                || (expected >= 0 && first != expected)) {
            Py_DECREF(decoded);
            break;
        }
        end = PyList_GET_SIZE(events);
        if (prescan_events(items, count, end, known, &legacy_at, &unknown_at) < 0) {
            Py_DECREF(decoded);
            str_cache_close();
            return NULL;
        }
        if ((PyList_CheckExact(decoded) ? PyList_SetSlice(events, end, end, decoded)
                                        : PyList_Append(events, decoded)) < 0) {
            Py_DECREF(decoded);
            str_cache_close();
            return NULL;
        }
        Py_DECREF(decoded);
        if (expected >= 0) {
            expected += count;
        }
    }
    str_cache_close();
    if (prescan != Py_None && prescan_store(prescan, legacy_at, unknown_at) < 0) {
        return NULL;
    }
    return Py_BuildValue("(nL)", i, expected);
}

static inline int
non_empty_str(PyObject *value)
{
    return value != NULL && PyUnicode_CheckExact(value) && PyUnicode_GET_LENGTH(value) > 0;
}

PyDoc_STRVAR(message_shape_ok_doc,
"message_shape_ok(event, /) -> bool\n\n"
"True when dsh.session.session._check_message_shape would accept this surface event: an\n"
"identified message with the type's role, a source with a kind (model + provider + model for\n"
"assistant/message; tool + callId for tool/result, whose content is one tool-result block\n"
"naming that call) and array content. False: the Python check runs and names the problem.");

/* 1 when the shape is fine, 0 when Python must look, -1 on error. */
static int
shape_ok(PyObject *event)
{
    PyObject *etype, *data, *message, *source, *kind, *content, *role;
    int assistant, tool, cmp;
    if (!PyDict_Check(event)) {
        return 0;
    }
    etype = PyDict_GetItem(event, s_type);
    data = PyDict_GetItem(event, s_data);
    if (etype == NULL || data == NULL || !PyUnicode_CheckExact(etype)) {
        return 0;
    }
    assistant = str_is(etype, s_assistant_message);
    tool = str_is(etype, s_tool_result);
    if (str_is(etype, s_user_message)) {
        message = data;
        role = s_user;
    }
    else if (str_is(etype, s_system_message)) {
        message = data;
        role = s_system;
    }
    else if (assistant || tool) {
        message = PyDict_Check(data) ? PyDict_GetItem(data, s_message) : NULL;
        role = assistant ? s_assistant : s_user;
    }
    else {
        return 0;
    }
    if (message == NULL || !PyDict_Check(message)
            || !non_empty_str(PyDict_GetItem(message, s_id))) {
        return 0;
    }
    if (!str_is(PyDict_GetItem(message, s_role), role)) {
        return 0;
    }
    source = PyDict_GetItem(message, s_source);
    if (source == NULL || !PyDict_Check(source)) {
        return 0;
    }
    kind = PyDict_GetItem(source, s_kind);
    content = PyDict_GetItem(message, s_content);
    if (!non_empty_str(kind) || content == NULL || !PyList_Check(content)) {
        return 0;
    }
    if (assistant) {
        if (!str_is(kind, s_model) || !non_empty_str(PyDict_GetItem(source, s_provider))
                || !non_empty_str(PyDict_GetItem(source, s_model))) {
            return 0;
        }
    }
    else if (tool) {
        PyObject *call_id = PyDict_GetItem(source, s_call_id), *block, *inner, *named;
        if (!str_is(kind, s_tool) || !non_empty_str(call_id) || PyList_GET_SIZE(content) != 1) {
            return 0;
        }
        block = PyList_GET_ITEM(content, 0);
        if (!PyDict_Check(block) || !str_is(PyDict_GetItem(block, s_type), s_tool_result_block)) {
            return 0;
        }
        inner = PyDict_GetItem(block, s_content);
        named = PyDict_GetItem(block, s_tool_call_id);
        if (inner == NULL || !PyList_Check(inner) || named == NULL) {
            return 0;
        }
        cmp = PyObject_RichCompareBool(named, call_id, Py_EQ);
        if (cmp < 0) {
            return -1;
        }
        if (!cmp) {
            return 0;
        }
    }
    return 1;
}

static PyObject *
message_shape_ok(PyObject *module, PyObject *event)
{
    int ok = shape_ok(event);
    if (ok < 0) {
        return NULL;
    }
    return PyBool_FromLong(ok);
}

/* 1 when sources is what an append's provenance check accepts at once: a list of exact
 * ints in [0, seq) without duplicates (empty only on assistant/message); 0 otherwise (Python
 * judges, and names any problem). Long lists are left to Python's set-based check. */
static int
plain_sources(PyObject *sources, long long seq, int assistant)
{
    Py_ssize_t k, m, n;
    long long values[64];
    if (!PyList_Check(sources)) {
        return 0;
    }
    n = PyList_GET_SIZE(sources);
    if (n > 64 || (n == 0 && !assistant)) {
        return 0;
    }
    for (k = 0; k < n; k++) {
        if (!safe_int_at_least(PyList_GET_ITEM(sources, k), 0, &values[k]) || values[k] >= seq) {
            return 0;
        }
        for (m = 0; m < k; m++) {
            if (values[m] == values[k]) {
                return 0;
            }
        }
    }
    return 1;
}

/* 1 when the data of a turn/start, step/start, step/end or turn/end event has the shape
 * dsh.session._session._check_core_shape accepts (the reference), in its common forms: {turn},
 * {turn, step}, {turn, reason: {kind}} with a bare kind (completed, blocked, max-tokens,
 * interrupted) or {kind: "aborted", reason: {...}}; counts exact ints in [1, 2**53 - 1].
 * 0 for anything else, any other type included: the caller's Python check judges it. */
static int
turn_shape_ok(PyObject *etype, PyObject *data)
{
    PyObject *reason, *kind;
    Py_ssize_t size;
    if (data == NULL || !PyDict_Check(data)) {
        return 0;
    }
    size = PyDict_GET_SIZE(data);
    if (str_is(etype, s_turn_start)) {
        return size == 1 && safe_int_at_least(PyDict_GetItem(data, s_turn), 1, NULL);
    }
    if (str_is(etype, s_step_start) || str_is(etype, s_step_end)) {
        return size == 2 && safe_int_at_least(PyDict_GetItem(data, s_turn), 1, NULL)
            && safe_int_at_least(PyDict_GetItem(data, s_step), 1, NULL);
    }
    if (!str_is(etype, s_turn_end) || size != 2
            || !safe_int_at_least(PyDict_GetItem(data, s_turn), 1, NULL)) {
        return 0;
    }
    reason = PyDict_GetItem(data, s_reason);
    if (reason == NULL || !PyDict_Check(reason)) {
        return 0;
    }
    kind = PyDict_GetItem(reason, s_kind);
    if (str_is(kind, s_completed) || str_is(kind, s_blocked) || str_is(kind, s_max_tokens)
            || str_is(kind, s_interrupted)) {
        return PyDict_GET_SIZE(reason) == 1;
    }
    if (str_is(kind, s_aborted)) {
        PyObject *cause = PyDict_GetItem(reason, s_reason);
        return cause != NULL && PyDict_Check(cause);
    }
    return 0;
}

PyDoc_STRVAR(admit_plain_doc,
"admit_plain(seed, start, base, event_type, surface_types, nodes, cache[, stop_types], /)\n"
"-> int\n\n"
"The common case of Session.restore's admission loop, from index start of the seed (a list\n"
"or tuple of events whose seqs start at base): plain log-only events (an exact event_type,\n"
"exactly type/seq/time/data, or those and \"ignorable\": true, a str type outside\n"
"surface_types other than request/header, request/header-delta, request/context and\n"
"session/end-seed, seq base + index, an int time within +-(2**53 - 1)) need nothing; an\n"
"event whose type is in the set stop_types (the turn-shaped types of a snapshot seed,\n"
"Session.create) is admitted only when its data has the common shape the core shape check\n"
"accepts ({turn}, {turn, step}, {turn, reason} with a bare or aborted kind), else left to\n"
"the caller; plain surface appends (such an envelope plus\n"
"surfaceOp \"append\" and optionally sourceEventSeqs that need no check, a message shape\n"
"message_shape_ok accepts) append their seq to the list nodes and their projected message\n"
"(or None) to the dict cache under the seq. Returns the index of the first other event\n"
"(len(seed) when none): the caller admits it in Python and calls again after it.");

static PyObject *
admit_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *seed, *surface_types, *nodes, *cache, *stop_types = NULL, **items;
    PyTypeObject *event_type;
    Py_ssize_t i, n, start, base;

    if (!configured()) {
        return NULL;
    }
    if (nargs < 7 || nargs > 8 || !(PyList_CheckExact(args[0]) || PyTuple_CheckExact(args[0]))
            || !PyType_Check(args[3]) || !PyAnySet_Check(args[4])
            || !PyList_CheckExact(args[5]) || !PyDict_CheckExact(args[6])
            || (nargs == 8 && !PyAnySet_Check(args[7]))) {
        PyErr_SetString(PyExc_TypeError, "admit_plain(list | tuple, int, int, type, frozenset, "
                        "list, dict[, frozenset])");
        return NULL;
    }
    if (nargs == 8) {
        stop_types = args[7];
    }
    start = PyLong_AsSsize_t(args[1]);
    base = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    seed = args[0];
    event_type = (PyTypeObject *)args[3];
    surface_types = args[4];
    nodes = args[5];
    cache = args[6];
    n = PySequence_Fast_GET_SIZE(seed);
    items = PySequence_Fast_ITEMS(seed);
    for (i = start < 0 ? 0 : start; i < n; i++) {
        PyObject *ev = items[i], *etype, *seq, *data, *op, *sources = NULL, *message;
        Py_ssize_t size;
        long long s;
        int surface, ok;
        if (Py_TYPE(ev) != event_type) {
            break;
        }
        size = PyDict_GET_SIZE(ev);
        etype = PyDict_GetItem(ev, s_type);
        seq = PyDict_GetItem(ev, s_seq);
        data = PyDict_GetItem(ev, s_data);
        if (size < 4 || size > 6 || etype == NULL || !PyUnicode_CheckExact(etype)
                || !safe_int_at_least(seq, 0, &s) || s != (long long)base + i
                || !safe_int_at_least(PyDict_GetItem(ev, s_time), -max_safe, NULL)
                || data == NULL) {
            break;
        }
        if (stop_types != NULL) {
            int stop = PySet_Contains(stop_types, etype);
            if (stop < 0) {
                return NULL;
            }
            if (stop && !turn_shape_ok(etype, data)) {
                break;
            }
        }
        surface = PySet_Contains(surface_types, etype);
        if (surface < 0) {
            return NULL;
        }
        if (size == 4 || (size == 5 && !surface
                          && PyDict_GetItem(ev, s_ignorable) == Py_True)) {
            if (surface || str_is(etype, s_request_header) || str_is(etype, s_end_seed)
                    || str_is(etype, s_request_header_delta)
                    || str_is(etype, s_request_context)) {
                break;
            }
            continue;  /* a log-only event, ignorable or not: nothing to check */
        }
        op = PyDict_GetItem(ev, s_surface_op);
        if (size == 6) {
            sources = PyDict_GetItem(ev, s_source_event_seqs);
        }
        if (!surface || !str_is(op, s_append) || (size == 6 && (sources == NULL
                || !plain_sources(sources, s, str_is(etype, s_assistant_message))))) {
            break;
        }
        ok = shape_ok(ev);
        if (ok < 0) {
            return NULL;
        }
        if (!ok) {
            break;
        }
        /* what derive_event_message projects; the shape check made these lookups safe */
        if (str_is(etype, s_user_message) || str_is(etype, s_system_message)) {
            message = data;
        }
        else {
            message = PyDict_GetItem(data, s_message);
            if (str_is(etype, s_assistant_message)
                    && PyList_GET_SIZE(PyDict_GetItem(message, s_content)) == 0) {
                message = Py_None;
            }
        }
        if (PyDict_SetItem(cache, seq, message) < 0 || PyList_Append(nodes, seq) < 0) {
            return NULL;
        }
    }
    return PyLong_FromSsize_t(i);
}

/* Fill view with obj's buffer when it is an array('q') (any C-contiguous int64 buffer); else -1
 * with the TypeError "<who>: <what> must be an array('q')". The caller releases the view. */
static int
int64_buffer(PyObject *obj, Py_buffer *view, int writable, const char *who, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS
                           | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        return -1;
    }
    if (view->itemsize != 8 || view->format == NULL || strcmp(view->format, "q") != 0) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s: %s must be an array('q')", who, what);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(gather_messages_doc,
"gather_messages(nodes, start, cache, out, /) -> int\n\n"
"Append to the list out, in order, the cached message of each seq in nodes[start:] (a list\n"
"of ints, or an array('q') of a session resumed through a restore point), skipping the None\n"
"entries (nodes that project nothing). Stops at the first seq the dict cache does not hold\n"
"and returns its index (len(nodes) when all were found): the caller projects that node in\n"
"Python and calls again. The reference is the Python loop of\n"
"dsh.session.session.Session.derive_messages.");

static PyObject *
gather_messages(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *nodes, *cache, *out, *message, *key;
    Py_ssize_t start, index, count;
    Py_buffer view;
    int packed;
    const long long *seqs = NULL;
    if (nargs != 4 || !PyDict_Check(args[2]) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "gather_messages(list | array('q'), int, dict, list)");
        return NULL;
    }
    nodes = args[0];
    cache = args[2];
    out = args[3];
    packed = !PyList_Check(nodes);
    if (packed) {
        if (int64_buffer(nodes, &view, 0, "gather_messages", "nodes") < 0) {
            return NULL;
        }
        seqs = (const long long *)view.buf;
        count = view.len / 8;
    }
    else {
        count = PyList_GET_SIZE(nodes);
    }
    start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) {
        goto fail;
    }
    /* the dict's keys are ints: no Python code runs below, so the buffer cannot be resized */
    for (index = start < 0 ? 0 : start; index < count; index++) {
        if (packed) {
            key = PyLong_FromLongLong(seqs[index]);
            if (key == NULL) {
                goto fail;
            }
            message = PyDict_GetItemWithError(cache, key);
            Py_DECREF(key);
        }
        else {
            message = PyDict_GetItemWithError(cache, PyList_GET_ITEM(nodes, index));
        }
        if (message == NULL) {
            if (PyErr_Occurred()) {
                goto fail;
            }
            break;
        }
        if (message != Py_None && PyList_Append(out, message) < 0) {
            goto fail;
        }
    }
    if (packed) {
        PyBuffer_Release(&view);
    }
    return PyLong_FromSsize_t(index);
fail:
    if (packed) {
        PyBuffer_Release(&view);
    }
    return NULL;
}

PyDoc_STRVAR(seqs_below_doc,
"seqs_below(seqs, bound, /) -> bool\n\n"
"True when every element of seqs, an array('q') (or any C-contiguous int64 buffer), lies in\n"
"0 .. bound - 1: the range check of a restore point's packed surface nodes, one pass over\n"
"the buffer with no int object made. The reference is the Python check of\n"
"dsh.session._surface.seqs_below.");

static PyObject *
seqs_below(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    long long bound;
    const long long *seqs;
    Py_ssize_t index, count;
    int below = 1;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "seqs_below(array('q'), int)");
        return NULL;
    }
    bound = PyLong_AsLongLong(args[1]);
    if (bound == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (int64_buffer(args[0], &view, 0, "seqs_below", "seqs") < 0) {
        return NULL;
    }
    seqs = (const long long *)view.buf;
    count = view.len / 8;
    if (bound < 0) {
        bound = 0;
    }
    for (index = 0; index < count; index++) {
        /* as unsigned: a negative seq reads as >= 2**63, beyond any bound */
        if ((unsigned long long)seqs[index] >= (unsigned long long)bound) {
            below = 0;
            break;
        }
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(below);
}

/* ---------------------------------------------------------------------------------------
 * The SQLite seal checksum text (dsh.persistence._seal.rows_crc): a growable byte buffer.
 */

/* "%lld" of value without snprintf's format parsing, written backwards to end at `end` (24
 * bytes before it are room enough): its first character. */
static char *
decimal_ll(char *end, long long value)
{
    char *p = end;
    unsigned long long magnitude = value < 0 ? 0ULL - (unsigned long long)value
                                             : (unsigned long long)value;
    /* two digits a division (a row's time is 13 digits: its seal text writes one a row) */
    static const char pairs[201] =
        "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
        "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
        "8081828384858687888990919293949596979899";
    while (magnitude >= 100) {
        unsigned int two = (unsigned int)(magnitude % 100);
        magnitude /= 100;
        *--p = pairs[2 * two + 1];
        *--p = pairs[2 * two];
    }
    if (magnitude >= 10) {
        *--p = pairs[2 * magnitude + 1];
        *--p = pairs[2 * magnitude];
    }
    else {
        *--p = (char)('0' + magnitude);
    }
    if (value < 0) {
        *--p = '-';
    }
    return p;
}

static int
fallback_int(void)
{
    PyErr_SetNone(Fallback);
    return -1;
}

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
} Buf;

static int
buf_put(Buf *b, const char *bytes, Py_ssize_t n)
{
    if (n == 0) {
        /* nothing to copy: an empty TEXT first into a Buf not yet grown would pass memcpy
         * a NULL destination, undefined even for 0 bytes (UBSan stops there) */
        return 0;
    }
    if (b->size + n > b->capacity) {
        Py_ssize_t want = (b->size + n) * 2 + 256;
        char *grown = PyMem_Realloc(b->data, (size_t)want);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = grown;
        b->capacity = want;
    }
    memcpy(b->data + b->size, bytes, (size_t)n);
    b->size += n;
    return 0;
}

/* str (UTF-8; a lone surrogate -> Fallback, Python encodes it with surrogatepass) */
static int
buf_str(Buf *b, PyObject *s)
{
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(s, &n);
    if (utf8 == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
            return fallback_int();
        }
        return -1;
    }
    return buf_put(b, utf8, n);
}

static int
buf_hex_raw(Buf *b, const unsigned char *p, Py_ssize_t n)
{
    static const char digits[] = "0123456789abcdef";
    Py_ssize_t i;
    char pair[2];
    for (i = 0; i < n; i++) {
        pair[0] = digits[p[i] >> 4];
        pair[1] = digits[p[i] & 15];
        if (buf_put(b, pair, 2) < 0) {
            return -1;
        }
    }
    return 0;
}

static int
buf_hex(Buf *b, PyObject *bytes)
{
    return buf_hex_raw(b, (const unsigned char *)PyBytes_AS_STRING(bytes),
                       PyBytes_GET_SIZE(bytes));
}

/* f"{v}" of a long long into b */
static int
buf_ll(Buf *b, long long value)
{
    char text[24], *p = decimal_ll(text + sizeof text, value);
    return buf_put(b, p, text + sizeof text - p);
}

/* f"{v}" of an exact int (not bool) within long long; else Fallback */
static int
buf_int(Buf *b, PyObject *v)
{
    int overflow;
    long long value;
    if (!PyLong_CheckExact(v)) {
        return fallback_int();
    }
    value = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return fallback_int();
    }
    return buf_ll(b, value);  /* two of these per row of a whole read */
}

/* f"{v}" of a str or None; else Fallback */
static int
buf_text_or_none(Buf *b, PyObject *v)
{
    if (v == Py_None) {
        return buf_put(b, "None", 4);
    }
    if (PyUnicode_CheckExact(v)) {
        return buf_str(b, v);
    }
    return fallback_int();
}

/* The metadata of a row whose columns start at `skip` (0, or 1 after a read's rowid). */
static int
buf_meta(Buf *b, PyObject *row, Py_ssize_t skip)
{
    PyObject *ignorable, *sources;
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 7 + skip) {
        return fallback_int();
    }
    ignorable = PyTuple_GET_ITEM(row, skip + 6);
    sources = PyTuple_GET_ITEM(row, skip + 4);
    if (buf_int(b, PyTuple_GET_ITEM(row, skip)) < 0 || buf_put(b, "\x1f", 1) < 0
            || buf_text_or_none(b, PyTuple_GET_ITEM(row, skip + 1)) < 0
            || buf_put(b, "\x1f", 1) < 0
            || buf_int(b, PyTuple_GET_ITEM(row, skip + 2)) < 0 || buf_put(b, "\x1f", 1) < 0
            || buf_text_or_none(b, PyTuple_GET_ITEM(row, skip + 5)) < 0
            || buf_put(b, "\x1f", 1) < 0) {
        return -1;
    }
    if (ignorable == Py_None) {
        if (buf_put(b, "None", 4) < 0) {
            return -1;
        }
    }
    else if (PyBool_Check(ignorable)) {
        if (buf_put(b, ignorable == Py_True ? "1" : "0", 1) < 0) {
            return -1;
        }
    }
    else if (buf_int(b, ignorable) < 0) {
        return -1;
    }
    if (buf_put(b, "\x1f", 1) < 0) {
        return -1;
    }
    if (PyBytes_CheckExact(sources)) {
        return buf_hex(b, sources);
    }
    return buf_text_or_none(b, sources);
}

static int
buf_payload(Buf *b, PyObject *row, Py_ssize_t skip)
{
    PyObject *data = PyTuple_GET_ITEM(row, skip + 3);  /* buf_meta checked the size */
    if (PyUnicode_CheckExact(data)) {
        return buf_str(b, data);
    }
    if (PyBytes_CheckExact(data)) {
        return buf_put(b, "\x00", 1) < 0 ? -1 : buf_hex(b, data);
    }
    return fallback_int();
}

/* The seal text of the rows [start, stop) of the list rows into b: every row's metadata
 * joined by \x1e, \x1d, every payload joined by \x1e (rows_text, seal_batch). The list does
 * not change while it is read: the loops run no Python code. -1 with Fallback or an error. */
static int
seal_text(Buf *b, PyObject *rows, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t skip)
{
    Py_ssize_t i;
    for (i = start; i < stop; i++) {
        if ((i > start && buf_put(b, "\x1e", 1) < 0)
                || buf_meta(b, PyList_GET_ITEM(rows, i), skip) < 0) {
            return -1;
        }
    }
    if (buf_put(b, "\x1d", 1) < 0) {
        return -1;
    }
    for (i = start; i < stop; i++) {
        if ((i > start && buf_put(b, "\x1e", 1) < 0)
                || buf_payload(b, PyList_GET_ITEM(rows, i), skip) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The same seal text is emitted from SQLite's C API by seal_row_text (the C read,
 * read_rows): a change to the one is a change to the other. */
PyDoc_STRVAR(rows_text_doc,
"rows_text(rows, start=0, stop=len(rows), skip=0, /) -> bytes\n\n"
"The UTF-8 text dsh.persistence._seal.rows_crc checksums for the SQLite event rows\n"
"rows[start:stop] of a list, each (seq, type, time, data, source_event_seqs, surface_op,\n"
"ignorable) after its first skip columns (1: a read's rowid), without copying them: every\n"
"row's metadata joined by \\x1e, then \\x1d, then every payload joined by \\x1e. Raises\n"
"Fallback for any value outside the column types a read returns (or a string holding a\n"
"lone surrogate): the Python join, the reference, then runs.");

static PyObject *
rows_text(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Buf b = {NULL, 0, 0};
    Py_ssize_t i, n, start = 0, skip = 0;
    PyObject *rows, *out;
    if (nargs < 1 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "rows_text(rows, start=0, stop=len, skip=0)");
        return NULL;
    }
    rows = args[0];
    if (!PyList_CheckExact(rows)) {
        PyErr_SetNone(Fallback);
        return NULL;
    }
    n = PyList_GET_SIZE(rows);
    if (nargs > 1 && ((start = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())) {
        return NULL;
    }
    if (nargs > 2) {
        Py_ssize_t stop = PyLong_AsSsize_t(args[2]);
        if (stop == -1 && PyErr_Occurred()) {
            return NULL;
        }
        n = stop < n ? stop : n;
    }
    if (nargs > 3 && ((skip = PyLong_AsSsize_t(args[3])) == -1 && PyErr_Occurred())) {
        return NULL;
    }
    if (start < 0 || skip < 0 || skip > 1) {
        PyErr_SetString(PyExc_ValueError, "rows_text: start >= 0 and skip 0 or 1");
        return NULL;
    }
    if (seal_text(&b, rows, start, n, skip) < 0) {
        PyMem_Free(b.data);
        return NULL;
    }
    out = PyBytes_FromStringAndSize(b.data, b.size);
    PyMem_Free(b.data);
    return out;
}

/* ---------------------------------------------------------------------------------------
 * The SQLite append path: one batch of scalar events -> the rows encode_batch returns
 * (dsh.persistence._sqlite_schema, docs/formats.md#schema-17). Python's encode_batch stays the
 * reference and runs alone for anything below that raises Fallback.
 */

/* 1 when every key of the envelope is one of the seven names encode_batch accepts. */
static int
envelope_keys_ok(PyObject *event)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(event, &pos, &key, &value)) {
        if (!(str_is(key, s_type) || str_is(key, s_seq) || str_is(key, s_time)
                || str_is(key, s_data) || str_is(key, s_surface_op)
                || str_is(key, s_source_event_seqs) || str_is(key, s_ignorable))) {
            return 0;
        }
    }
    return 1;
}

static inline int
is_frozen_container(PyObject *value)
{
    return PyObject_TypeCheck(value, frozen_dict_type)
        || PyObject_TypeCheck(value, frozen_list_type);
}

/* dumps(value).decode("utf-8") of dsh.json for a frozen container or an exact str: orjson's
 * bytes as str. Anything else, or any orjson error (a lone surrogate: dsh.json escapes it
 * itself), -> Fallback. */
static PyObject *
dumps_text(PyObject *dumps, PyObject *value, PyObject **bytes_out)
{
    PyObject *bytes, *text;
    if (!is_frozen_container(value) && !PyUnicode_CheckExact(value)) {
        return fallback();
    }
    bytes = PyObject_CallOneArg(dumps, value);
    if (bytes == NULL) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError)) {
            return NULL;
        }
        PyErr_Clear();
        return fallback();
    }
    if (!PyBytes_CheckExact(bytes)) {
        Py_DECREF(bytes);
        return fallback();
    }
    if (bytes_out != NULL) {
        *bytes_out = bytes;  /* the caller decides (zstd above the threshold) */
        return Py_NewRef(Py_None);
    }
    text = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes), "strict");
    Py_DECREF(bytes);
    return text;
}

/* encode_source_event_seqs (schema 17): LEB128 first value, ZigZag deltas after it. */
static PyObject *
encode_varint_seqs(PyObject *seqs)
{
    Py_ssize_t i, n;
    PyObject **items, *out;
    unsigned char *buf, *p;
    long long prev = 0, value;
    unsigned long long z;
    if (!PyList_Check(seqs) && !PyTuple_Check(seqs)) {
        return fallback();
    }
    n = PySequence_Fast_GET_SIZE(seqs);
    items = PySequence_Fast_ITEMS(seqs);
    buf = PyMem_Malloc((size_t)(n * 10 + 1));
    if (buf == NULL) {
        return PyErr_NoMemory();
    }
    p = buf;
    for (i = 0; i < n; i++) {
        if (!safe_int_at_least(items[i], 0, &value)) {
            PyMem_Free(buf);
            return fallback();
        }
        if (i == 0) {
            z = (unsigned long long)value;
        }
        else if (value >= prev) {
            z = (unsigned long long)(value - prev) * 2;
        }
        else {
            z = (unsigned long long)(prev - value) * 2 - 1;
        }
        prev = value;
        while (z >= 0x80) {
            *p++ = (unsigned char)((z & 0x7F) | 0x80);
            z >>= 7;
        }
        *p++ = (unsigned char)z;
    }
    out = PyBytes_FromStringAndSize((const char *)buf, p - buf);
    PyMem_Free(buf);
    return out;
}

struct sealed;
static PyObject *sealed_data_column(struct sealed *sealed, PyObject *data, int legacy,
                                    PyObject *big, Py_ssize_t threshold);

/* One event -> (seq, type, time, data, source_event_seqs, surface_op, ignorable). With sealed
 * (encode_sealed_rows), data is written by the sealed pass, which keeps what the leaf needs. */
static PyObject *
encode_scalar(PyObject *event, int legacy, PyObject *dumps, PyObject *big, Py_ssize_t threshold,
              struct sealed *sealed)
{
    PyObject *type, *seq, *time, *data, *seqs, *op, *ignorable;
    PyObject *bytes = NULL, *data_col = NULL, *seqs_col = NULL, *op_col = NULL, *row;
    if (!PyDict_Check(event) || !envelope_keys_ok(event)) {
        return fallback();
    }
    type = PyDict_GetItemWithError(event, s_type);
    seq = PyDict_GetItemWithError(event, s_seq);
    time = PyDict_GetItemWithError(event, s_time);
    data = PyDict_GetItemWithError(event, s_data);
    ignorable = PyDict_GetItemWithError(event, s_ignorable);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (type == NULL || !PyUnicode_CheckExact(type) || PyUnicode_GET_LENGTH(type) == 0
            || !safe_int_at_least(seq, 0, NULL) || !safe_int_at_least(time, -max_safe, NULL)
            || data == NULL || (ignorable != NULL && ignorable != Py_True)
            || (ignorable != NULL && legacy)
            || (!legacy && str_is(type, s_assistant_chunk))) {
        /* encode_batch's own checks name it, or it packs the chunk runs of schema 17 */
        return fallback();
    }
    seqs = PyDict_GetItemWithError(event, s_source_event_seqs);
    op = PyDict_GetItemWithError(event, s_surface_op);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (sealed != NULL) {
        data_col = sealed_data_column(sealed, data, legacy, big, threshold);
    }
    else if (legacy) {
        data_col = dumps_text(dumps, data, NULL);
    }
    else {
        PyObject *none = dumps_text(dumps, data, &bytes);
        if (none != NULL) {
            Py_DECREF(none);
            if (PyBytes_GET_SIZE(bytes) >= threshold) {
                data_col = PyObject_CallOneArg(big, bytes);  /* zstd when it is smaller */
            }
            else {
                data_col = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(bytes),
                                                PyBytes_GET_SIZE(bytes), "strict");
            }
            Py_DECREF(bytes);
        }
    }
    if (data_col == NULL) {
        return NULL;
    }
    if (seqs == NULL || seqs == Py_None) {
        seqs_col = Py_NewRef(Py_None);
    }
    else {
        seqs_col = legacy ? dumps_text(dumps, seqs, NULL) : encode_varint_seqs(seqs);
    }
    if (seqs_col == NULL) {
        Py_DECREF(data_col);
        return NULL;
    }
    op_col = (op == NULL || op == Py_None) ? Py_NewRef(Py_None) : dumps_text(dumps, op, NULL);
    if (op_col == NULL) {
        Py_DECREF(data_col);
        Py_DECREF(seqs_col);
        return NULL;
    }
    row = PyTuple_New(7);
    if (row == NULL) {
        Py_DECREF(data_col);
        Py_DECREF(seqs_col);
        Py_DECREF(op_col);
        return NULL;
    }
    PyTuple_SET_ITEM(row, 0, Py_NewRef(seq));
    PyTuple_SET_ITEM(row, 1, Py_NewRef(type));
    PyTuple_SET_ITEM(row, 2, Py_NewRef(time));
    PyTuple_SET_ITEM(row, 3, data_col);
    PyTuple_SET_ITEM(row, 4, seqs_col);
    PyTuple_SET_ITEM(row, 5, op_col);
    PyTuple_SET_ITEM(row, 6, ignorable == Py_True ? PyLong_FromLong(1) : Py_NewRef(Py_None));
    if (PyTuple_GET_ITEM(row, 6) == NULL) {
        Py_DECREF(row);
        return NULL;
    }
    return row;
}

/* encode_rows' arguments (encode_sealed_rows' first five; count_ok: their number is right):
 * 0 with the schema and threshold read, -1 with TypeError (usage), another error or Fallback
 * (values encode_batch reads itself) set. */
static int
rows_arguments(PyObject *const *args, int count_ok, const char *usage, long *schema,
               Py_ssize_t *threshold)
{
    if (!count_ok || !(PyList_CheckExact(args[0]) || PyTuple_CheckExact(args[0]))
            || !PyLong_CheckExact(args[1]) || !PyCallable_Check(args[2])
            || !PyCallable_Check(args[3]) || !PyLong_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *schema = PyLong_AsLong(args[1]);
    *threshold = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) {
        return -1;
    }
    if ((*schema != 14 && *schema != 17) || *threshold < 0) {
        fallback();  /* encode_batch's own reading of the arguments */
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(encode_rows_doc,
"encode_rows(events, schema_version, dumps, encode_large, threshold, /) -> list[tuple]\n\n"
"The rows dsh.persistence._sqlite_schema.encode_batch returns for a batch of scalar events:\n"
"(seq, type, time, data, source_event_seqs, surface_op, ignorable) each, data as JSON text\n"
"(schema 17: encode_large(json_bytes) for data of threshold bytes or more, which compresses\n"
"it when that is smaller). events is a list or tuple of dicts; schema_version is 14 (JSON\n"
"text columns) or 17 (varint provenance BLOB, ignorable 1 or NULL); dumps is orjson.dumps.\n"
"Raises Fallback for anything encode_batch must judge or shape itself: an envelope its fast\n"
"check does not pass, an assistant/chunk event in schema 17 (chunk packing), an ignorable\n"
"event in schema 14, a payload that is not a frozen container (or a str surfaceOp), a\n"
"provenance value that is not a non-negative safe int, or any dumps error.");

static PyObject *
encode_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *events, *out, *row, **items;
    Py_ssize_t i, n, threshold;
    long schema;
    if (!configured() || rows_arguments(args, nargs == 5, "encode_rows(list | tuple, int, "
                                        "callable, callable, int)", &schema, &threshold) < 0) {
        return NULL;
    }
    events = args[0];
    n = PySequence_Fast_GET_SIZE(events);
    items = PySequence_Fast_ITEMS(events);
    out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        row = encode_scalar(items[i], schema == 14, args[2], args[3], threshold, NULL);
        if (row == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, row);
    }
    return out;
}

PyDoc_STRVAR(seqs_contiguous_doc,
"seqs_contiguous(events, base[, event_type], /) -> bool\n\n"
"True when every item of the list or tuple events is a dict whose \"seq\" is an exact int\n"
"equal to base + its index. False at the first one that is not: the caller's Python loop\n"
"(dsh.session.repair.open_turn_closers) then names it. With event_type, also False unless\n"
"every item is exactly of that type and its \"data\" a FrozenDict or FrozenList (or a\n"
"subclass): a batch the append path trusts as built by Session (its Python reference is\n"
"dsh.persistence.sqlite._backend.SqliteHandle._admit).");

static PyObject *
seqs_contiguous(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject **items, *seq;
    Py_ssize_t i, n;
    long long base, value;
    int overflow;
    if (!configured()) {
        return NULL;
    }
    PyTypeObject *event_type = NULL;
    if (nargs < 2 || nargs > 3 || !(PyList_CheckExact(args[0]) || PyTuple_CheckExact(args[0]))
            || !PyLong_CheckExact(args[1]) || (nargs == 3 && !PyType_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "seqs_contiguous(list | tuple, int[, type])");
        return NULL;
    }
    if (nargs == 3) {
        event_type = (PyTypeObject *)args[2];
    }
    base = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow || (base == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    n = PySequence_Fast_GET_SIZE(args[0]);
    items = PySequence_Fast_ITEMS(args[0]);
    for (i = 0; i < n; i++) {
        if (!PyDict_Check(items[i])) {
            Py_RETURN_FALSE;
        }
        if (event_type != NULL) {
            PyObject *data;
            if (Py_TYPE(items[i]) != event_type) {
                Py_RETURN_FALSE;
            }
            data = PyDict_GetItem(items[i], s_data);
            if (data == NULL || !(PyType_IsSubtype(Py_TYPE(data), frozen_dict_type)
                                  || PyType_IsSubtype(Py_TYPE(data), frozen_list_type))) {
                Py_RETURN_FALSE;
            }
        }
        seq = PyDict_GetItem(items[i], s_seq);
        if (seq == NULL || !PyLong_CheckExact(seq)) {
            Py_RETURN_FALSE;
        }
        value = PyLong_AsLongLongAndOverflow(seq, &overflow);
        if (overflow || value != base + i) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
    }
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(running_sums_below_doc,
"running_sums_below(seqs, bound, /) -> bool\n\n"
"Turn seqs, an array('q') of differences, into their running sums in place (the first is\n"
"the first seq); return True when every sum lies in 0 .. bound - 1. False at the first sum\n"
"out of range or past the int64 range, the array then left part summed (its caller drops\n"
"it). How a restore point's packed surface nodes come back. The reference is the Python\n"
"dsh.session._surface.running_sums_below.");

static PyObject *
running_sums_below(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    long long bound, total = 0, step;
    long long *seqs;
    Py_ssize_t index, count;
    int below = 1;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "running_sums_below(array('q'), int)");
        return NULL;
    }
    bound = PyLong_AsLongLong(args[1]);
    if (bound == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (int64_buffer(args[0], &view, 1, "running_sums_below", "seqs") < 0) {
        return NULL;
    }
    if (bound < 0) {
        bound = 0;
    }
    seqs = (long long *)view.buf;
    count = view.len / 8;
    for (index = 0; index < count; index++) {
        step = seqs[index];
        /* a sum past the int64 range is refused, as the reference's array would refuse it */
        if ((step > 0 && total > LLONG_MAX - step) || (step < 0 && total < LLONG_MIN - step)) {
            below = 0;
            break;
        }
        total += step;
        if ((unsigned long long)total >= (unsigned long long)bound) {
            below = 0;
            break;
        }
        seqs[index] = total;
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(below);
}

PyDoc_STRVAR(widen_sums_below_doc,
"widen_sums_below(seqs, differences, bound, /) -> bool\n\n"
"Fill seqs, an array('q') as long as the bytes-like differences, with the running sums of\n"
"those one-byte differences (each 0 .. 255; the first is the first seq); return True when\n"
"every sum lies in 0 .. bound - 1. False at the first sum out of range, seqs then left part\n"
"filled (its caller drops it). How a restore point's \"zb:\" surface nodes come back. The\n"
"reference is the Python dsh.session._surface.widen_sums_below.");

static PyObject *
widen_sums_below(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view, raw;
    long long bound, total = 0;
    long long *seqs;
    const unsigned char *steps;
    Py_ssize_t index, count;
    int below = 1;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "widen_sums_below(array('q'), bytes, int)");
        return NULL;
    }
    bound = PyLong_AsLongLong(args[2]);
    if (bound == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (int64_buffer(args[0], &view, 1, "widen_sums_below", "seqs") < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &raw, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    count = view.len / 8;
    if (raw.len != count) {
        PyBuffer_Release(&raw);
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "widen_sums_below: one seq for each difference");
        return NULL;
    }
    if (bound < 0) {
        bound = 0;
    }
    seqs = (long long *)view.buf;
    steps = (const unsigned char *)raw.buf;
    for (index = 0; index < count; index++) {
        total += steps[index];  /* at most 255 * count: never past the int64 range */
        if (total >= bound) {
            below = 0;
            break;
        }
        seqs[index] = total;
    }
    PyBuffer_Release(&raw);
    PyBuffer_Release(&view);
    return PyBool_FromLong(below);
}

/* --- the seal chain's canonical bytes and leaves (docs/formats.md#the-seal-chain) --------- */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} wbuf;

static int
wb_grow(wbuf *b, Py_ssize_t extra)
{
    Py_ssize_t want = b->len + extra, cap = b->cap ? b->cap : 512;
    char *grown;
    if (want <= b->cap) {
        return 0;
    }
    while (cap < want) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    grown = PyMem_Realloc(b->data, (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = grown;
    b->cap = cap;
    return 0;
}

static inline int
wb_put(wbuf *b, const char *bytes, Py_ssize_t n)
{
    if (b->len + n > b->cap && wb_grow(b, n) < 0) {
        return -1;
    }
    memcpy(b->data + b->len, bytes, (size_t)n);
    b->len += n;
    return 0;
}

static const char hex_digits[] = "0123456789abcdef";

/* The escape of an ASCII code point dsh.json escapes ('"', '\\', C0 controls) as orjson
 * writes it (\b \t \n \f \r, else \u00xx); returns the position after it. */
static inline char *
escape_ascii(char *p, Py_UCS4 c)
{
    *p++ = '\\';
    switch (c) {
    case '"': *p++ = '"'; break;
    case '\\': *p++ = '\\'; break;
    case '\b': *p++ = 'b'; break;
    case '\t': *p++ = 't'; break;
    case '\n': *p++ = 'n'; break;
    case '\f': *p++ = 'f'; break;
    case '\r': *p++ = 'r'; break;
    default:
        *p++ = 'u'; *p++ = '0'; *p++ = '0';
        *p++ = hex_digits[c >> 4]; *p++ = hex_digits[c & 15];
    }
    return p;
}

#define PLAIN_ASCII(c) ((c) >= 0x20 && (c) != '"' && (c) != '\\')
/* Eight ASCII bytes at once (no byte has its top bit): (word - SWAR_ONES * k) & SWAR_HIGHS is
 * non-zero exactly when a byte is below k (no byte borrows from the next unless one is); a
 * byte equal to x is a zero byte of word ^ (SWAR_ONES * x), so below 1 there. */
#define SWAR_ONES 0x0101010101010101ULL
#define SWAR_HIGHS 0x8080808080808080ULL

/* A str as dsh.json writes it: UTF-8 with escape_ascii's escapes, every lone surrogate
 * escaped \udxxx as dsh.json's fallback does (orjson refuses them); everything else, U+2028/9
 * and DEL included, raw. */
static int
canon_str(wbuf *b, PyObject *text)
{
    Py_ssize_t i, n = PyUnicode_GET_LENGTH(text), run = 0;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_UCS4 c;
    char *p;
    /* at most 6 bytes a code point (\u00xx, \udxxx), plus the quotes */
    if (n > (PY_SSIZE_T_MAX - 2) / 6) {
        PyErr_NoMemory();
        return -1;
    }
    if (wb_grow(b, n * 6 + 2) < 0) {
        return -1;
    }
    p = b->data + b->len;
    *p++ = '"';
    if (PyUnicode_IS_ASCII(text)) {
        const char *ascii = (const char *)data;
        for (i = 0; i < n; i++) {
            if (i + 8 <= n) {  /* eight plain bytes at a time (ASCII: no byte has its top bit) */
                uint64_t word, quote, backslash;
                memcpy(&word, ascii + i, 8);
                quote = word ^ (SWAR_ONES * '"');
                backslash = word ^ (SWAR_ONES * '\\');
                if (((word - SWAR_ONES * 0x20) | (quote - SWAR_ONES) | (backslash - SWAR_ONES))
                        & SWAR_HIGHS) {
                    goto one;  /* a byte below 0x20, a '"' or a '\\' among them */
                }
                run += 8;
                i += 7;
                continue;
            }
        one:
            c = (unsigned char)ascii[i];
            if (PLAIN_ASCII(c)) {
                run++;
                continue;
            }
            memcpy(p, ascii + i - run, (size_t)run);  /* the plain run before it */
            p += run;
            run = 0;
            p = escape_ascii(p, c);
        }
        memcpy(p, ascii + n - run, (size_t)run);
        p += run;
    }
    else {
        for (i = 0; i < n; i++) {
            c = PyUnicode_READ(kind, data, i);
            if (c < 0x80) {
                if (PLAIN_ASCII(c)) {
                    *p++ = (char)c;
                }
                else {
                    p = escape_ascii(p, c);
                }
            }
            else if (c < 0x800) {
                *p++ = (char)(0xC0 | (c >> 6));
                *p++ = (char)(0x80 | (c & 0x3F));
            }
            else if (c >= 0xD800 && c <= 0xDFFF) {
                *p++ = '\\'; *p++ = 'u';
                *p++ = hex_digits[(c >> 12) & 15]; *p++ = hex_digits[(c >> 8) & 15];
                *p++ = hex_digits[(c >> 4) & 15]; *p++ = hex_digits[c & 15];
            }
            else if (c < 0x10000) {
                *p++ = (char)(0xE0 | (c >> 12));
                *p++ = (char)(0x80 | ((c >> 6) & 0x3F));
                *p++ = (char)(0x80 | (c & 0x3F));
            }
            else {
                *p++ = (char)(0xF0 | (c >> 18));
                *p++ = (char)(0x80 | ((c >> 12) & 0x3F));
                *p++ = (char)(0x80 | ((c >> 6) & 0x3F));
                *p++ = (char)(0x80 | (c & 0x3F));
            }
        }
    }
    *p++ = '"';
    b->len = p - b->data;
    return 0;
}

static int canon_value(wbuf *b, PyObject *value, PyObject *dumps, int depth);

/* The n entries of dict into entries[2n] (key, value, ...), keys in code point order
 * (PyUnicode_Compare, insertion sort: an event's objects have a handful of keys); -1 with
 * Fallback for a key that is not an exact str (or a dict that grew). Borrowed references. */
static int
sorted_entries(PyObject *dict, PyObject **entries, Py_ssize_t n)
{
    Py_ssize_t pos = 0, i = 0, j;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || i >= n) {
            fallback();
            return -1;
        }
        for (j = i; j > 0 && PyUnicode_Compare(entries[2 * j - 2], key) > 0; j--) {
            entries[2 * j] = entries[2 * j - 2];
            entries[2 * j + 1] = entries[2 * j - 1];
        }
        entries[2 * j] = key;
        entries[2 * j + 1] = value;
        i++;
    }
    return 0;
}

/* Keys in code point order (PyUnicode_Compare), as sorted() orders them in dsh.json and
 * orjson's OPT_SORT_KEYS does (UTF-8 byte order is code point order). The entries are
 * borrowed: a frozen dict does not change while it is written. */
static int
canon_dict(wbuf *b, PyObject *dict, PyObject *dumps, int depth)
{
    PyObject *stack_entries[64], **entries = stack_entries;
    Py_ssize_t n = PyDict_GET_SIZE(dict), i;
    int status = -1;
    if (n == 0) {
        return wb_put(b, "{}", 2);
    }
    if (n > 32) {
        entries = PyMem_Malloc(sizeof(PyObject *) * 2 * (size_t)n);
        if (entries == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (sorted_entries(dict, entries, n) < 0) {
        goto done;
    }
    for (i = 0; i < n; i++) {
        if (wb_put(b, i ? "," : "{", 1) < 0 || canon_str(b, entries[2 * i]) < 0
                || wb_put(b, ":", 1) < 0
                || canon_value(b, entries[2 * i + 1], dumps, depth + 1) < 0) {
            goto done;
        }
    }
    status = wb_put(b, "}", 1);
done:
    if (entries != stack_entries) {
        PyMem_Free(entries);
    }
    return status;
}

/* A long long in decimal, as orjson writes an int. */
static int
canon_int(wbuf *b, long long number)
{
    char digits[24], *p = decimal_ll(digits + sizeof digits, number);
    return wb_put(b, p, digits + sizeof digits - p);
}

/* One JSON value as dumps_canonical writes it. Floats go through dumps (orjson.dumps, which
 * both of dsh.json's paths use for them); anything else unusual -> Fallback. */
static int
canon_value(wbuf *b, PyObject *value, PyObject *dumps, int depth)
{
    long long number;
    int overflow, length;
    Py_ssize_t i, n;
    PyObject *bytes;
    if (depth > FAST_DEPTH) {
        fallback();
        return -1;
    }
    if (PyUnicode_CheckExact(value)) {
        return canon_str(b, value);
    }
    if (value == Py_None) {
        return wb_put(b, "null", 4);
    }
    if (value == Py_True) {
        return wb_put(b, "true", 4);
    }
    if (value == Py_False) {
        return wb_put(b, "false", 5);
    }
    if (PyLong_CheckExact(value)) {
        number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (number == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            fallback();
            return -1;
        }
        return canon_int(b, number);
    }
    if (PyDict_Check(value)) {
        return canon_dict(b, value, dumps, depth);
    }
    if (PyList_Check(value)) {
        n = PyList_GET_SIZE(value);
        if (n == 0) {
            return wb_put(b, "[]", 2);
        }
        for (i = 0; i < n; i++) {
            if (wb_put(b, i ? "," : "[", 1) < 0
                    || canon_value(b, PyList_GET_ITEM(value, i), dumps, depth + 1) < 0) {
                return -1;
            }
        }
        return wb_put(b, "]", 1);
    }
    if (PyFloat_CheckExact(value)) {
        bytes = PyObject_CallOneArg(dumps, value);
        if (bytes == NULL || !PyBytes_CheckExact(bytes)) {
            Py_XDECREF(bytes);
            if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_MemoryError)) {
                return -1;
            }
            PyErr_Clear();
            fallback();
            return -1;
        }
        length = wb_put(b, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
        Py_DECREF(bytes);
        return length;
    }
    fallback();  /* a tuple, a subclass of str or int, a foreign type: the reference judges */
    return -1;
}

/* dumps_canonical(value) into b (appended); -1 with Fallback or another error set. */
static int
canon_top(wbuf *b, PyObject *value, PyObject *dumps)
{
    if (!PyObject_TypeCheck(value, frozen_dict_type)
            && !PyObject_TypeCheck(value, frozen_list_type)) {
        fallback();  /* the reference snapshots it first */
        return -1;
    }
    return canon_value(b, value, dumps, 0);
}

PyDoc_STRVAR(canonical_doc,
"canonical(value, dumps, /) -> bytes\n\n"
"dsh.json.dumps_canonical(value) for a FrozenDict or FrozenList: compact JSON, every object's\n"
"keys in code point order, lone surrogates escaped \\udxxx; dumps is orjson.dumps (floats).\n"
"Raises Fallback for anything else (another top-level type, a non-str key, a tuple, an int\n"
"beyond 64 bits, a subclass of str or int, nesting deeper than FAST_DEPTH): the reference,\n"
"dsh.json.dumps_canonical, then judges it.");

static PyObject *
canonical(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    wbuf b = {NULL, 0, 0};
    PyObject *out;
    if (!configured()) {
        return NULL;
    }
    if (nargs != 2 || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "canonical(value, callable)");
        return NULL;
    }
    if (canon_top(&b, args[0], args[1]) < 0) {
        PyMem_Free(b.data);
        return NULL;
    }
    out = PyBytes_FromStringAndSize(b.data, b.len);
    PyMem_Free(b.data);
    return out;
}


/* SHA-256 with the x86 SHA extensions (SHA-NI), when the CPU has them: a leaf is a few
 * 64-byte blocks, so hashlib's per-call cost (a hasher object, a digest() call, a bytes
 * object each) was most of a leaf's time. Without them the hashlib constructor is called. */
static int use_sha_ni = 0;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <stdint.h>
#define SHA_NI_BUILT 1

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

/* Compress whole 64-byte blocks into state (FIPS 180-4 order: a..h). */
__attribute__((target("sha,sse4.1,ssse3")))
static void
sha256_blocks(uint32_t state[8], const unsigned char *data, size_t blocks)
{
    __m128i state0, state1, msg, tmp, mask, abef, cdgh, w[4];
    int i;
    tmp = _mm_loadu_si128((const __m128i *)&state[0]);
    state1 = _mm_loadu_si128((const __m128i *)&state[4]);
    tmp = _mm_shuffle_epi32(tmp, 0xB1);            /* CDAB */
    state1 = _mm_shuffle_epi32(state1, 0x1B);      /* EFGH */
    state0 = _mm_alignr_epi8(tmp, state1, 8);      /* ABEF */
    state1 = _mm_blend_epi16(state1, tmp, 0xF0);   /* CDGH */
    mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    while (blocks--) {
        abef = state0;
        cdgh = state1;
        /* unrolled whole, w[] stays in registers (a loop kept it in memory: ~2x slower) */
#pragma GCC unroll 16
        for (i = 0; i < 16; i++) {  /* four rounds each; w[i % 4] holds words 4i..4i+3 */
            if (i < 4) {
                w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(data + 16 * i)),
                                        mask);
            }
            else {
                tmp = _mm_sha256msg1_epu32(w[i % 4], w[(i + 1) % 4]);
                tmp = _mm_add_epi32(tmp, _mm_alignr_epi8(w[(i + 3) % 4], w[(i + 2) % 4], 4));
                w[i % 4] = _mm_sha256msg2_epu32(tmp, w[(i + 3) % 4]);
            }
            msg = _mm_add_epi32(w[i % 4], _mm_loadu_si128((const __m128i *)&sha256_k[4 * i]));
            state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
            msg = _mm_shuffle_epi32(msg, 0x0E);
            state0 = _mm_sha256rnds2_epu32(state0, state1, msg);
        }
        state0 = _mm_add_epi32(state0, abef);
        state1 = _mm_add_epi32(state1, cdgh);
        data += 64;
    }
    tmp = _mm_shuffle_epi32(state0, 0x1B);         /* FEBA */
    state1 = _mm_shuffle_epi32(state1, 0xB1);      /* DCHG */
    state0 = _mm_blend_epi16(tmp, state1, 0xF0);   /* DCBA */
    state1 = _mm_alignr_epi8(state1, tmp, 8);      /* HGFE */
    _mm_storeu_si128((__m128i *)&state[0], state0);
    _mm_storeu_si128((__m128i *)&state[4], state1);
}

/* SHA-256 of data[:n] into out (32 bytes). */
static void
sha256_ni(const unsigned char *data, size_t n, unsigned char out[32])
{
    uint32_t state[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f,
                         0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char tail[128];
    size_t whole = n / 64, rest = n % 64, padded = rest < 56 ? 64 : 128;
    unsigned long long bits = (unsigned long long)n * 8;
    int k;
    if (whole) {
        sha256_blocks(state, data, whole);
    }
    memset(tail, 0, sizeof tail);
    memcpy(tail, data + whole * 64, rest);
    tail[rest] = 0x80;
    for (k = 0; k < 8; k++) {
        tail[padded - 1 - k] = (unsigned char)(bits >> (8 * k));
    }
    sha256_blocks(state, tail, padded / 64);
    for (k = 0; k < 8; k++) {
        out[4 * k] = (unsigned char)(state[k] >> 24);
        out[4 * k + 1] = (unsigned char)(state[k] >> 16);
        out[4 * k + 2] = (unsigned char)(state[k] >> 8);
        out[4 * k + 3] = (unsigned char)state[k];
    }
}
#endif

/* sha256(data[:n]).digest() through the hashlib constructor given (OpenSSL's, SHA-NI). */
static PyObject *
sha256_of(PyObject *sha256, const char *data, Py_ssize_t n)
{
    PyObject *bytes, *hasher, *digest;
    bytes = PyBytes_FromStringAndSize(data, n);
    if (bytes == NULL) {
        return NULL;
    }
    hasher = PyObject_CallOneArg(sha256, bytes);
    Py_DECREF(bytes);
    if (hasher == NULL) {
        return NULL;
    }
    digest = PyObject_CallMethodNoArgs(hasher, s_digest);
    Py_DECREF(hasher);
    if (digest != NULL && (!PyBytes_CheckExact(digest) || PyBytes_GET_SIZE(digest) != 32)) {
        Py_DECREF(digest);
        PyErr_SetString(PyExc_TypeError, "chain_leaves: sha256 must give 32-byte digests");
        return NULL;
    }
    return digest;
}

/* The leaf of one event (SHA-256(event key || canonical bytes), see chain_leaves) into
 * leaf[32]; head holds the batch key in its first 16 bytes, b is scratch. -1 with Fallback (the
 * reference judges the event) or another error set. */
static int
event_leaf(PyObject *event, unsigned char head[24], wbuf *b, PyObject *sha, PyObject *dumps,
           unsigned char leaf[32])
{
    PyObject *seq, *key, *digest;
    unsigned long long value;
    int k;
    if (!PyObject_TypeCheck(event, frozen_dict_type)) {
        fallback();
        return -1;
    }
    seq = PyDict_GetItemWithError(event, s_seq);
    if (seq == NULL || !PyLong_CheckExact(seq)) {
        if (!PyErr_Occurred()) {
            fallback();
        }
        return -1;
    }
    value = PyLong_AsUnsignedLongLong(seq);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        fallback();
        return -1;
    }
    for (k = 0; k < 8; k++) {
        head[16 + k] = (unsigned char)(value >> (8 * k));
    }
    b->len = 0;
#ifdef SHA_NI_BUILT
    if (use_sha_ni) {
        unsigned char digest_ni[32];
        sha256_ni(head, 24, digest_ni);
        if (wb_put(b, (const char *)digest_ni, 16) < 0 || canon_top(b, event, dumps) < 0) {
            return -1;
        }
        sha256_ni((const unsigned char *)b->data, (size_t)b->len, leaf);
        return 0;
    }
#endif
    key = sha256_of(sha, (const char *)head, 24);
    if (key == NULL) {
        return -1;
    }
    k = wb_put(b, PyBytes_AS_STRING(key), 16);
    Py_DECREF(key);
    if (k < 0 || canon_top(b, event, dumps) < 0) {
        return -1;
    }
    digest = sha256_of(sha, b->data, b->len);
    if (digest == NULL) {
        return -1;
    }
    memcpy(leaf, PyBytes_AS_STRING(digest), 32);
    Py_DECREF(digest);
    return 0;
}

PyDoc_STRVAR(chain_leaves_doc,
"chain_leaves(events, batch_key, sha256, dumps, /) -> list[bytes]\n\n"
"The seal chain's leaves of a batch under a 16-byte batch key: for each event of the list\n"
"or tuple events, SHA-256(event key || canonical bytes), the event key being\n"
"SHA-256(batch_key || seq as u64 little-endian)[:16] and the canonical bytes those of\n"
"canonical(event, dumps). sha256 is hashlib.sha256, called when the module's SHA_NI is 0\n"
"(no x86 SHA extensions, or DSH_SPEEDUPS_NO_SHA_NI set at import). Raises Fallback when an event is not a\n"
"FrozenDict with a \"seq\" int in 0 .. 2**64 - 1 or canonical() would: the reference,\n"
"dsh.persistence._chain.event_leaves, then computes (or refuses) the batch.");

static PyObject *
chain_leaves(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    wbuf b = {NULL, 0, 0};
    PyObject *events, *out = NULL, *leaf, **items;
    Py_ssize_t i, n;
    unsigned char head[24], digest[32];
    if (!configured()) {
        return NULL;
    }
    if (nargs != 4 || !(PyList_CheckExact(args[0]) || PyTuple_CheckExact(args[0]))
            || !PyBytes_CheckExact(args[1]) || PyBytes_GET_SIZE(args[1]) != 16
            || !PyCallable_Check(args[2]) || !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "chain_leaves(list | tuple, 16 bytes, callable, callable)");
        return NULL;
    }
    events = args[0];
    n = PySequence_Fast_GET_SIZE(events);
    items = PySequence_Fast_ITEMS(events);
    memcpy(head, PyBytes_AS_STRING(args[1]), 16);
    out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        if (event_leaf(items[i], head, &b, args[2], args[3], digest) < 0) {
            goto fail;
        }
        leaf = PyBytes_FromStringAndSize((const char *)digest, 32);
        if (leaf == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(out, i, leaf);
    }
    PyMem_Free(b.data);
    return out;
fail:
    PyMem_Free(b.data);
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(chain_digest_doc,
"chain_digest(events, start, stop, batch_key, sha256, dumps, /) -> bytes\n\n"
"SHA-256 of the concatenated chain_leaves of events[start:stop] (a list or tuple, 0 <= start\n"
"<= stop <= len(events)) under a 16-byte batch key: a chain record's digest over those\n"
"events, without a slice, a leaf object or a list of them (dsh verify checks every batch).\n"
"Raises Fallback where chain_leaves does: dsh.persistence._chain.event_leaves, the reference,\n"
"then computes (or refuses) the batch.");

static PyObject *
chain_digest(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    wbuf b = {NULL, 0, 0}, leaves = {NULL, 0, 0};
    PyObject *events, *out = NULL, **items;
    Py_ssize_t i, start, stop;
    unsigned char head[24];
    if (!configured()) {
        return NULL;
    }
    if (nargs != 6 || !(PyList_CheckExact(args[0]) || PyTuple_CheckExact(args[0]))
            || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])
            || !PyBytes_CheckExact(args[3]) || PyBytes_GET_SIZE(args[3]) != 16
            || !PyCallable_Check(args[4]) || !PyCallable_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "chain_digest(list | tuple, int, int, 16 bytes, callable, callable)");
        return NULL;
    }
    events = args[0];
    start = PyLong_AsSsize_t(args[1]);
    stop = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || stop == -1) && PyErr_Occurred()) {
        return NULL;
    }
    if (start < 0 || stop < start || stop > PySequence_Fast_GET_SIZE(events)) {
        PyErr_SetString(PyExc_ValueError, "chain_digest: need 0 <= start <= stop <= len");
        return NULL;
    }
    items = PySequence_Fast_ITEMS(events);
    memcpy(head, PyBytes_AS_STRING(args[3]), 16);
    /* the events are frozen: nothing below runs code that could change the sequence */
    for (i = start; i < stop; i++) {
        if (wb_grow(&leaves, 32) < 0
                || event_leaf(items[i], head, &b, args[4], args[5],
                              (unsigned char *)leaves.data + leaves.len) < 0) {
            goto done;
        }
        leaves.len += 32;
    }
#ifdef SHA_NI_BUILT
    if (use_sha_ni) {
        unsigned char digest[32];
        sha256_ni((const unsigned char *)(leaves.data ? leaves.data : ""), (size_t)leaves.len,
                  digest);
        out = PyBytes_FromStringAndSize((const char *)digest, 32);
        goto done;
    }
#endif
    out = sha256_of(args[4], leaves.data ? leaves.data : "", leaves.len);
done:
    PyMem_Free(b.data);
    PyMem_Free(leaves.data);
    return out;
}

/* ---- one serialization for a SQLite row and its seal leaf (encode_sealed_rows) ----------
 *
 * The row keeps the event's data in its own key order; the leaf hashes the canonical bytes
 * (every object's keys in code point order). Both are the same string, number and literal
 * bytes in another order: the data is written once, in its order, into the row text while
 * a tape records where each object and each of its entries lies; the canonical bytes are
 * then the row text's pieces copied in sorted order (an object whose keys, and its nested
 * objects' keys, are already in order is copied whole). */

typedef struct {
    Py_ssize_t start, end;  /* the object's bytes in the row text, '{' to after '}' */
    Py_ssize_t entries;     /* index of its first entry in the tape */
    Py_ssize_t count;       /* its entries */
    Py_ssize_t skip;        /* index of the first object after its nested ones */
    int in_order;           /* its keys and every nested object's keys are in canonical order */
} tape_object;

typedef struct {
    PyObject *key;          /* borrowed: a frozen object does not change while it is written */
    Py_ssize_t start, end;  /* "key":value in the row text */
    Py_ssize_t first;       /* index of the first object at or after start */
} tape_entry;

struct sealed {
    PyObject *dumps;         /* orjson.dumps, for floats (as canon_value) */
    wbuf row;                /* the data as the row stores it */
    wbuf canon;              /* scratch: event key, then the canonical bytes */
    tape_object *objects;
    Py_ssize_t n_objects, cap_objects;
    tape_entry *entries;
    Py_ssize_t n_entries, cap_entries;
};

static int
tape_grow(void **items, Py_ssize_t *cap, Py_ssize_t want, size_t size)
{
    Py_ssize_t grown = *cap ? *cap : 64;
    void *moved;
    if (want <= *cap) {
        return 0;
    }
    while (grown < want) {
        if (grown > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)size) {
            PyErr_NoMemory();
            return -1;
        }
        grown *= 2;
    }
    moved = PyMem_Realloc(*items, (size_t)grown * size);
    if (moved == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *items = moved;
    *cap = grown;
    return 0;
}

static int tape_value(struct sealed *t, PyObject *value, PyObject *dumps, int depth,
                      int *in_order);

/* An object in its own order into the row text, its entries on the tape. */
static int
tape_dict(struct sealed *t, PyObject *dict, PyObject *dumps, int depth, int *in_order)
{
    Py_ssize_t n = PyDict_GET_SIZE(dict), pos = 0, k = 0, index, first;
    PyObject *key, *value, *previous = NULL;
    int all = 1, nested;
    wbuf *b = &t->row;
    if (n == 0) {
        return wb_put(b, "{}", 2);  /* written the same in both orders: no record */
    }
    if (tape_grow((void **)&t->objects, &t->cap_objects, t->n_objects + 1,
                  sizeof(tape_object)) < 0
            || tape_grow((void **)&t->entries, &t->cap_entries, t->n_entries + n,
                         sizeof(tape_entry)) < 0) {
        return -1;
    }
    index = t->n_objects++;
    first = t->n_entries;
    t->n_entries += n;  /* this object's entries stay together; nested ones come after */
    t->objects[index].start = b->len;
    t->objects[index].entries = first;
    t->objects[index].count = n;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || k >= n) {
            fallback();
            return -1;
        }
        /* exact str keys, distinct: PyUnicode_Compare cannot fail or give 0 here */
        if (previous != NULL && PyUnicode_Compare(previous, key) > 0) {
            all = 0;
        }
        if (wb_put(b, k ? "," : "{", 1) < 0) {
            return -1;
        }
        t->entries[first + k].key = key;
        t->entries[first + k].start = b->len;
        t->entries[first + k].first = t->n_objects;
        if (canon_str(b, key) < 0 || wb_put(b, ":", 1) < 0
                || tape_value(t, value, dumps, depth + 1, &nested) < 0) {
            return -1;
        }
        t->entries[first + k].end = b->len;
        all &= nested;
        previous = key;
        k++;
    }
    if (k != n) {
        fallback();
        return -1;
    }
    if (wb_put(b, "}", 1) < 0) {
        return -1;
    }
    t->objects[index].end = b->len;
    t->objects[index].skip = t->n_objects;
    t->objects[index].in_order = all;
    *in_order = all;
    return 0;
}

/* One JSON value in its own order, written as canon_value writes it (so the row text is
 * dsh.json.dumps of it); the same values leave the same ones to the reference (Fallback). */
static int
tape_value(struct sealed *t, PyObject *value, PyObject *dumps, int depth, int *in_order)
{
    Py_ssize_t i, n;
    int nested;
    *in_order = 1;
    if (depth > FAST_DEPTH) {
        fallback();
        return -1;
    }
    if (PyUnicode_CheckExact(value)) {
        return canon_str(&t->row, value);  /* most values: first, as in canon_value */
    }
    if (PyDict_Check(value)) {
        return tape_dict(t, value, dumps, depth, in_order);
    }
    if (PyList_Check(value)) {
        n = PyList_GET_SIZE(value);
        if (n == 0) {
            return wb_put(&t->row, "[]", 2);
        }
        for (i = 0; i < n; i++) {
            if (wb_put(&t->row, i ? "," : "[", 1) < 0
                    || tape_value(t, PyList_GET_ITEM(value, i), dumps, depth + 1,
                                  &nested) < 0) {
                return -1;
            }
            *in_order &= nested;
        }
        return wb_put(&t->row, "]", 1);
    }
    return canon_value(&t->row, value, dumps, depth);  /* a scalar: the same in both orders */
}

static int emit_object(struct sealed *t, Py_ssize_t index);

/* The canonical bytes of row[start:end) into t->canon: copied, except each object that starts
 * there (from object index first on), which is written in canonical order. */
static int
emit_range(struct sealed *t, Py_ssize_t start, Py_ssize_t end, Py_ssize_t first)
{
    Py_ssize_t pos = start, index = first;
    while (index < t->n_objects && t->objects[index].start < end) {
        if (wb_put(&t->canon, t->row.data + pos, t->objects[index].start - pos) < 0
                || emit_object(t, index) < 0) {
            return -1;
        }
        pos = t->objects[index].end;
        index = t->objects[index].skip;
    }
    return wb_put(&t->canon, t->row.data + pos, end - pos);
}

/* One object of the tape in canonical order: its entries sorted as canon_dict sorts them. */
static int
emit_object(struct sealed *t, Py_ssize_t index)
{
    tape_object *object = &t->objects[index];
    Py_ssize_t stack_order[32], *order = stack_order, n = object->count, i, j, entry;
    tape_entry *entries = t->entries + object->entries;
    int status = -1;
    if (object->in_order) {
        return wb_put(&t->canon, t->row.data + object->start, object->end - object->start);
    }
    if (n > 32) {
        order = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)n);
        if (order == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    for (i = 0; i < n; i++) {  /* insertion sort, as canon_dict */
        for (j = i; j > 0 && PyUnicode_Compare(entries[order[j - 1]].key, entries[i].key) > 0;
             j--) {
            order[j] = order[j - 1];
        }
        order[j] = i;
    }
    for (i = 0; i < n; i++) {
        entry = order[i];
        if (wb_put(&t->canon, i ? "," : "{", 1) < 0
                || emit_range(t, entries[entry].start, entries[entry].end,
                              entries[entry].first) < 0) {
            goto done;
        }
    }
    status = wb_put(&t->canon, "}", 1);
done:
    if (order != stack_order) {
        PyMem_Free(order);
    }
    return status;
}

/* The data column of one event (encode_scalar's, written by the tape): JSON text, or
 * big(bytes) in schema 17 from threshold bytes on. The tape is kept for sealed_leaf. */
static PyObject *
sealed_data_column(struct sealed *t, PyObject *data, int legacy, PyObject *big,
                   Py_ssize_t threshold)
{
    PyObject *bytes, *column;
    int in_order;
    if (!is_frozen_container(data) && !PyUnicode_CheckExact(data)) {
        return fallback();  /* as dumps_text */
    }
    t->row.len = 0;
    t->n_objects = t->n_entries = 0;
    if (tape_value(t, data, t->dumps, 1, &in_order) < 0) {
        return NULL;
    }
    if (!legacy && t->row.len >= threshold) {
        bytes = PyBytes_FromStringAndSize(t->row.data, t->row.len);
        if (bytes == NULL) {
            return NULL;
        }
        column = PyObject_CallOneArg(big, bytes);  /* zstd when it is smaller */
        Py_DECREF(bytes);
        return column;
    }
    return PyUnicode_DecodeUTF8(t->row.data ? t->row.data : "", t->row.len, "strict");
}

/* SHA-256 of data[:n] into out: SHA-NI when the CPU has it, else the hashlib constructor. */
static int
sha256_into(PyObject *sha, const char *data, Py_ssize_t n, unsigned char out[32])
{
    PyObject *digest;
#ifdef SHA_NI_BUILT
    if (use_sha_ni) {
        sha256_ni((const unsigned char *)(data ? data : ""), (size_t)n, out);
        return 0;
    }
#endif
    digest = sha256_of(sha, data ? data : "", n);
    if (digest == NULL) {
        return -1;
    }
    memcpy(out, PyBytes_AS_STRING(digest), 32);
    Py_DECREF(digest);
    return 0;
}

/* The leaf of the event whose data the tape holds: event_leaf's bytes, the data's canonical
 * bytes taken from the row text (head: batch key, then room for the seq). */
static int
sealed_leaf(struct sealed *t, PyObject *event, unsigned char head[24], PyObject *sha,
            unsigned char leaf[32])
{
    PyObject *entries[16];
    Py_ssize_t n, i;
    unsigned long long seq;
    unsigned char event_key[32];
    int k;
    if (!PyObject_TypeCheck(event, frozen_dict_type) || PyDict_GET_SIZE(event) > 8) {
        fallback();  /* event_leaf's rule; encode_scalar let only the seven envelope keys by */
        return -1;
    }
    seq = PyLong_AsUnsignedLongLong(PyDict_GetItem(event, s_seq));  /* a safe int >= 0 */
    if (seq == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    for (k = 0; k < 8; k++) {
        head[16 + k] = (unsigned char)(seq >> (8 * k));
    }
    if (sha256_into(sha, (const char *)head, 24, event_key) < 0) {
        return -1;
    }
    t->canon.len = 0;
    if (wb_put(&t->canon, (const char *)event_key, 16) < 0) {
        return -1;
    }
    n = PyDict_GET_SIZE(event);
    if (sorted_entries(event, entries, n) < 0) {
        return -1;
    }
    for (i = 0; i < n; i++) {
        if (wb_put(&t->canon, i ? "," : "{", 1) < 0 || canon_str(&t->canon, entries[2 * i]) < 0
                || wb_put(&t->canon, ":", 1) < 0) {
            return -1;
        }
        if (str_is(entries[2 * i], s_data)) {
            if (emit_range(t, 0, t->row.len, 0) < 0) {
                return -1;
            }
        }
        else if (canon_value(&t->canon, entries[2 * i + 1], t->dumps, 1) < 0) {
            return -1;
        }
    }
    if (wb_put(&t->canon, "}", 1) < 0) {
        return -1;
    }
    return sha256_into(sha, t->canon.data, t->canon.len, leaf);
}

PyDoc_STRVAR(encode_sealed_rows_doc,
"encode_sealed_rows(events, schema_version, dumps, encode_large, threshold, batch_key,\n"
"                   sha256, /) -> tuple[list[tuple], bytes]\n\n"
"encode_rows(events, schema_version, dumps, encode_large, threshold) and the seal chain\n"
"digest of the batch under the 16-byte batch_key (chain_digest(events, 0, len(events),\n"
"batch_key, sha256, dumps)) in one pass: each event's data is written once, in its own key\n"
"order, for the row, and its canonical bytes are that text's pieces in sorted order.\n"
"Raises Fallback wherever encode_rows or chain_leaves would: the caller then runs both\n"
"references (dsh.persistence.sqlite._schema.encode_batch, dsh.persistence._chain).");

static PyObject *
encode_sealed_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    struct sealed t;
    wbuf leaves = {NULL, 0, 0};
    PyObject *events, *rows = NULL, *row, *out = NULL;
    Py_ssize_t i, n, threshold;
    unsigned char head[24], digest[32];
    long schema;
    const char *usage = "encode_sealed_rows(list | tuple, int, callable, callable, int, "
                        "16 bytes, callable)";
    if (!configured()) {
        return NULL;
    }
    if (nargs == 7 && (!PyBytes_CheckExact(args[5]) || PyBytes_GET_SIZE(args[5]) != 16
                       || !PyCallable_Check(args[6]))) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (rows_arguments(args, nargs == 7, usage, &schema, &threshold) < 0) {
        return NULL;
    }
    memset(&t, 0, sizeof t);
    t.dumps = args[2];
    memcpy(head, PyBytes_AS_STRING(args[5]), 16);
    events = args[0];
    n = PySequence_Fast_GET_SIZE(events);
    rows = PyList_New(n);
    if (rows == NULL) {
        return NULL;
    }
    /* the events are frozen, but dumps and the hash are Python callbacks: each event is
     * taken afresh from the sequence and held while used (a callback that changed the
     * caller's list cannot leave a stale item pointer) */
    for (i = 0; i < n; i++) {
        PyObject *event;
        int bad;
        if (i >= PySequence_Fast_GET_SIZE(events)) {
            PyErr_SetString(PyExc_RuntimeError, "encode_sealed_rows: the events changed");
            goto done;
        }
        event = Py_NewRef(PySequence_Fast_GET_ITEM(events, i));
        row = encode_scalar(event, schema == 14, args[2], args[3], threshold, &t);
        if (row == NULL) {
            Py_DECREF(event);
            goto done;
        }
        PyList_SET_ITEM(rows, i, row);
        bad = wb_grow(&leaves, 32) < 0
            || sealed_leaf(&t, event, head, args[6],
                           (unsigned char *)leaves.data + leaves.len) < 0;
        Py_DECREF(event);
        if (bad) {
            goto done;
        }
        leaves.len += 32;
    }
    if (sha256_into(args[6], leaves.data, leaves.len, digest) < 0) {
        goto done;
    }
    out = Py_BuildValue("(Oy#)", rows, (const char *)digest, (Py_ssize_t)32);
done:
    Py_DECREF(rows);
    PyMem_Free(leaves.data);
    PyMem_Free(t.row.data);
    PyMem_Free(t.canon.data);
    PyMem_Free(t.objects);
    PyMem_Free(t.entries);
    return out;
}

/* ---- importers: the number check of dsh.json.loads_plain (reference: _plain_numbers) ---- */

static int plain_walk(PyObject *value, int depth);

/* One child of a container: 1 plain, 0 the exact path must judge, -1 error set; *as_int gets
 * a new reference when the child is an integral float to replace. */
static int
plain_child(PyObject *child, int depth, PyObject **as_int)
{
    *as_int = NULL;
    if (PyDict_CheckExact(child) || PyList_CheckExact(child)) {
        return plain_walk(child, depth + 1);
    }
    if (PyLong_CheckExact(child)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(child, &overflow);
        if (x == -1 && PyErr_Occurred()) {
            return -1;
        }
        return !(overflow || x > max_safe || x < -max_safe);
    }
    if (PyFloat_CheckExact(child)) {
        double d = PyFloat_AS_DOUBLE(child);
        if (isfinite(d) && d == floor(d) && fabs(d) <= (double)max_safe) {
            if (d == 0.0 && signbit(d)) {
                return 0;
            }
            *as_int = PyLong_FromDouble(d);
            return *as_int == NULL ? -1 : 1;
        }
    }
    return 1;
}

/* 1: every number of the tree is plain (integral floats within +-max_safe made ints in place);
 * 0: the caller must take the exact path (an unsafe int, -0.0); -1: error set. */
static int
plain_walk(PyObject *value, int depth)
{
    PyObject *as_int;
    int ok;
    if (depth > 2000) {  /* orjson nests at most 1024 levels: this never trips on its trees */
        return 0;
    }
    if (PyDict_CheckExact(value)) {
        Py_ssize_t pos = 0;
        PyObject *key, *child;
        while (PyDict_Next(value, &pos, &key, &child)) {
            ok = plain_child(child, depth, &as_int);
            if (as_int != NULL) {
                /* replacing the value of an existing key keeps the iteration valid */
                ok = PyDict_SetItem(value, key, as_int) < 0 ? -1 : ok;
                Py_DECREF(as_int);
            }
            if (ok <= 0) {
                return ok;
            }
        }
        return 1;
    }
    if (PyList_CheckExact(value)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
            ok = plain_child(PyList_GET_ITEM(value, i), depth, &as_int);
            if (as_int != NULL) {
                PyList_SetItem(value, i, as_int);  /* steals as_int */
            }
            if (ok <= 0) {
                return ok;
            }
        }
        return 1;
    }
    /* a bare number takes the exact path; a bare string, bool or null is plain */
    return !(PyLong_CheckExact(value) || PyFloat_CheckExact(value));
}

PyDoc_STRVAR(line_scan_doc,
"line_scan(data, /) -> (bool, int)\n\n"
"One pass over the bytes of a JSON text: whether it holds a run of 19 or more digits that\n"
"may be a number's (what dsh.json.has_long_number answers, its reference), and how many '['\n"
"and '{' bytes it holds (the bound on its nesting depth that the importers check).");

static unsigned char line_classes[256];  /* line_scan's byte classes, filled on first use */

#if defined(__SSE2__)
#include <emmintrin.h>

/* line_scan's quick pass, 16 bytes at a time: counts the brackets and answers 1 when no run
 * of 19 digits or more is found (then there is no long number); 0 when one is (the exact
 * byte pass then decides whether it is a number's) */
static int
line_scan_sse2(const unsigned char *p, Py_ssize_t n, Py_ssize_t *brackets)
{
    Py_ssize_t i = 0, count = 0, run = 0;
    const __m128i zero = _mm_set1_epi8('0' - 1), nine = _mm_set1_epi8('9' + 1),
        square = _mm_set1_epi8('['), curly = _mm_set1_epi8('{');
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        /* signed compares: bytes >= 0x80 are negative, below '0', so never digits */
        unsigned int digits = (unsigned int)_mm_movemask_epi8(
            _mm_and_si128(_mm_cmpgt_epi8(v, zero), _mm_cmplt_epi8(v, nine)));
        unsigned int open = (unsigned int)_mm_movemask_epi8(
            _mm_or_si128(_mm_cmpeq_epi8(v, square), _mm_cmpeq_epi8(v, curly)));
        count += __builtin_popcount(open);
        if (digits == 0xFFFF) {
            run += 16;
        }
        else {
            /* the run continued from before ends at the first non-digit; a run inside 16
             * bytes is shorter than 19; the last one continues into the next chunk */
            run += __builtin_ctz(~digits);
            if (run >= 19) {
                return 0;
            }
            run = __builtin_clz((~digits << 16) | 0xFFFF);
        }
        if (run >= 19) {
            return 0;
        }
    }
    for (; i < n; i++) {
        unsigned char c = p[i];
        if (c >= '0' && c <= '9') {
            if (++run >= 19) {
                return 0;
            }
            continue;
        }
        run = 0;
        count += c == '[' || c == '{';
    }
    *brackets = count;
    return 1;
}
#endif

/* line_scan's answer for n bytes at p: whether a long number may be there, and brackets */
static int
line_scan_bytes(const unsigned char *p, Py_ssize_t n, Py_ssize_t *brackets_out)
{
    Py_ssize_t i, run = 0, brackets = 0;
    int long_number = 0;
#if defined(__SSE2__)
    if (line_scan_sse2(p, n, brackets_out)) {
        return 0;
    }
    /* a run of 19 digits or more: the exact pass below judges it */
#endif
    if (!line_classes[(unsigned char)'0']) {
        for (i = '0'; i <= '9'; i++) {
            line_classes[i] = 1;
        }
        line_classes[(unsigned char)'['] = line_classes[(unsigned char)'{'] = 2;
    }
    /* without a branch a byte: the class table says digit (1) or bracket (2) */
    for (i = 0; i < n; i++) {
        unsigned char k = line_classes[p[i]];
        brackets += k >> 1;
        run = (k & 1) ? run + 1 : 0;
        /* a maximal run starting at i + 1 - run: after a byte no number's digits
         * follow, it is inside a string or a fraction (has_long_digit_run's rule) */
        if (run == 19 && (i + 1 - run == 0 || number_lead((char)p[i - run]))) {
            long_number = 1;
        }
    }
    *brackets_out = brackets;
    return long_number;
}

static PyObject *
line_scan(PyObject *module, PyObject *data)
{
    Py_ssize_t brackets = 0;
    int long_number;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "line_scan(bytes)");
        return NULL;
    }
    long_number = line_scan_bytes((const unsigned char *)PyBytes_AS_STRING(data),
                                  PyBytes_GET_SIZE(data), &brackets);
    return Py_BuildValue("(On)", long_number ? Py_True : Py_False, brackets);
}

PyDoc_STRVAR(plain_numbers_doc,
"plain_numbers(value, /) -> bool\n\n"
"The number check of dsh.json.loads_plain on a tree straight from orjson.loads (reference:\n"
"dsh.json._plain_numbers): integral floats within +-max_safe_int become ints in place; False\n"
"for an int outside +-max_safe_int, -0.0, a bare number or nesting past 2000 levels (the\n"
"caller then decodes through the exact path).");

static PyObject *
plain_numbers(PyObject *module, PyObject *value)
{
    if (!configured()) {
        return NULL;
    }
    int ok = plain_walk(value, 0);
    if (ok < 0) {
        return NULL;
    }
    return PyBool_FromLong(ok);
}


PyDoc_STRVAR(decode_plain_doc,
"decode_plain(data, max_depth, /) -> object | None\n\n"
"One JSONL record as dsh.interop._common.decode_line decodes it (its reference), for the\n"
"common line: no run of digits that may be a long number, at most max_depth brackets, valid\n"
"JSON for orjson and numbers plain_numbers keeps. None for any other line (and for a 'null'\n"
"line): the Python function then decodes it and names what is wrong.");

static PyObject *orjson_loads = NULL;

static PyObject *
decode_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *data, *value;
    Py_ssize_t brackets = 0, limit;
    int ok;
    if (nargs != 2 || !PyBytes_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decode_plain(bytes, int)");
        return NULL;
    }
    if (!configured()) {
        return NULL;
    }
    data = args[0];
    limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (line_scan_bytes((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                        &brackets) || brackets > limit) {
        Py_RETURN_NONE;
    }
    if (orjson_loads == NULL) {
        PyObject *orjson = PyImport_ImportModule("orjson");
        if (orjson == NULL) {
            return NULL;
        }
        orjson_loads = PyObject_GetAttrString(orjson, "loads");
        Py_DECREF(orjson);
        if (orjson_loads == NULL) {
            return NULL;
        }
    }
    value = PyObject_CallOneArg(orjson_loads, data);
    if (value == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) {  /* orjson.JSONDecodeError */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return NULL;
    }
    ok = plain_walk(value, 0);
    if (ok <= 0) {
        Py_DECREF(value);
        if (ok < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    return value;
}

/* ---------------------------------------------------------------------------------------
 * An adapter's whole-history read (dsh.adapters._log; docs/rules.md#verified-page-in,
 * docs/adapters.md#busy-sessions-reads-and-names):
 * the framework records held in a stored event's data, as their JSON texts, cut out of the
 * checked row text without parsing the rest. The reference is dsh.adapters._records
 * (record_texts, Python); a text this walk cannot vouch for gives None and the caller decodes
 * the row as before.
 */

typedef struct {
    int surrogate;  /* a \u escape of D800-DFFF (orjson reads no lone surrogate) */
} RecScan;

static const char *
rec_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
        p++;
    }
    return p;
}

/* p at '"': the byte after the closing quote, or NULL when the string is no JSON string
 * orjson reads (unterminated, a raw control byte, an unknown escape, a short \u escape);
 * *escaped set when it holds a backslash, scan->surrogate for a \u escape of a surrogate. */
static inline const char *
rec_string(const char *p, const char *end, int *escaped, RecScan *scan)
{
    p++;
    for (;;) {
        unsigned char c;
#if defined(__SSE2__)
        /* 16 bytes at a time to the first quote, backslash or control character: straight
         * to it (the first set bit of the mask), not byte by byte through the bytes before
         * it (most strings of a record are member names, shorter than 16 bytes); the byte
         * found is the one judged below, without a second look through the words */
        while (end - p >= 16) {
            const __m128i v = _mm_loadu_si128((const __m128i *)p);
            unsigned int hit = (unsigned int)_mm_movemask_epi8(_mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                             _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                /* unsigned v <= 0x1F: the smaller of v and 0x1F is v */
                _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1F)), v)));
            if (hit != 0) {
                p += __builtin_ctz(hit);
                goto judge;
            }
            p += 16;
        }
#endif
        /* 8 bytes at a time while none is a quote, a backslash or a control character (the
         * tests are exact: a word passes only when no byte of it is one) */
        while (end - p >= 8) {
            unsigned long long w, q, b;
            memcpy(&w, p, 8);
            q = w ^ 0x2222222222222222ULL;
            b = w ^ 0x5C5C5C5C5C5C5C5CULL;
            if ((((q - 0x0101010101010101ULL) & ~q) | ((b - 0x0101010101010101ULL) & ~b)
                 | ((w - 0x2020202020202020ULL) & ~w)) & 0x8080808080808080ULL) {
                break;
            }
            p += 8;
        }
        /* then byte by byte to the first such byte */
        while (p < end && (c = (unsigned char)*p) != '"' && c != '\\' && c >= 0x20) {
            p++;
        }
        if (p >= end) {
            return NULL;  /* unterminated */
        }
#if defined(__SSE2__)
    judge:
#endif
        c = (unsigned char)*p;
        if (c == '"') {
            return p + 1;
        }
        if (c < 0x20 || p + 1 >= end) {
            return NULL;  /* a raw control byte, or a backslash last */
        }
        /* a backslash */
        *escaped = 1;
        switch (p[1]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            p += 2;  /* past the escaped character (an escaped quote too) */
            continue;
        case 'u': {
            int k, h, u = 0;
            if (end - p < 6) {
                return NULL;
            }
            for (k = 2; k < 6; k++) {
                if ((h = jp_hex((unsigned char)p[k])) < 0) {
                    return NULL;
                }
                u = (u << 4) | h;
            }
            if (u >= 0xD800 && u <= 0xDFFF) {
                scan->surrogate = 1;
            }
            p += 6;
            continue;
        }
        default:
            return NULL;  /* an unknown escape */
        }
    }
}

/* The end of the number or literal at p, or NULL when it is none orjson reads as finite: a
 * number whose integer digits and positive exponent pass REC_MAGNITUDE could overflow to
 * infinity, which orjson refuses (declined, as any doubt is; an underflow reads as 0.0). */
#define REC_MAGNITUDE 300
static const char *
rec_scalar(const char *p, const char *end)
{
    const char *d;
    Py_ssize_t magnitude = 1, exponent = 0;
    int negative = 0;
    if (end - p >= 4 && (memcmp(p, "true", 4) == 0 || memcmp(p, "null", 4) == 0)) {
        return p + 4;
    }
    if (end - p >= 5 && memcmp(p, "false", 5) == 0) {
        return p + 5;
    }
    if (p < end && *p == '-') {
        p++;
    }
    if (p < end && *p == '0') {
        p++;
    }
    else {
        for (d = p; p < end && is_digit(*p); p++) {
        }
        if (p == d) {
            return NULL;
        }
        magnitude = p - d;
    }
    if (p < end && *p == '.') {
        for (d = ++p; p < end && is_digit(*p); p++) {
        }
        if (p == d) {
            return NULL;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) {
            negative = *p == '-';
            p++;
        }
        for (d = p; p < end && is_digit(*p); p++) {
            if (exponent <= REC_MAGNITUDE) {
                exponent = 10 * exponent + (*p - '0');
            }
        }
        if (p == d) {
            return NULL;
        }
    }
    if (magnitude + (negative ? 0 : exponent) > REC_MAGNITUDE) {
        return NULL;
    }
    return p;
}

/* The byte after the JSON value at p, or NULL when it is not a value orjson reads: the whole
 * grammar is checked (separators, bracket pairs, strings, numbers), so a cut never vouches for
 * text the reference's parse refuses. Nesting deeper than REC_DEPTH (orjson stops at 1024 in
 * the whole text, which holds this value a few levels down) is declined. */
#define REC_DEPTH 512
#define rec_value(p, end, scan) rec_value_in(p, end, scan, REC_DEPTH)

/* rec_value of a value `REC_DEPTH - limit` containers down in the text it is part of (the
 * same nesting declined as a walk from the top of that text declines) */
static const char *
rec_value_in(const char *p, const char *end, RecScan *scan, Py_ssize_t limit)
{
    char open[REC_DEPTH];  /* the closing bracket each open container waits for */
    Py_ssize_t depth = 0;
    int ignored = 0;
    for (;;) {
        /* a value at p */
        if (p >= end) {
            return NULL;
        }
        if (*p == '"') {
            if ((p = rec_string(p, end, &ignored, scan)) == NULL) {
                return NULL;
            }
        }
        else if (*p == '{' || *p == '[') {
            char close = *p == '{' ? '}' : ']';
            if (depth >= limit) {
                return NULL;
            }
            open[depth++] = close;
            p = rec_ws(p + 1, end);
            if (p < end && *p == close) {
                depth--;
                p++;
            }
            else if (close == ']') {
                continue;  /* the first item */
            }
            else {
                goto member;
            }
        }
        else if ((p = rec_scalar(p, end)) == NULL) {
            return NULL;
        }
        /* after a value: the end of its containers, or the next item or member */
        for (;;) {
            if (depth == 0) {
                return p;
            }
            p = rec_ws(p, end);
            if (p < end && *p == open[depth - 1]) {
                depth--;
                p++;
                continue;
            }
            if (p >= end || *p != ',') {
                return NULL;
            }
            p = rec_ws(p + 1, end);
            break;
        }
        if (open[depth - 1] == ']') {
            continue;
        }
    member:
        if (p >= end || *p != '"' || (p = rec_string(p, end, &ignored, scan)) == NULL) {
            return NULL;
        }
        p = rec_ws(p, end);
        if (p >= end || *p != ':') {
            return NULL;
        }
        p = rec_ws(p + 1, end);
    }
}

/* The UTF-8 of the str `name`, or NULL (no error set) when it is no str or has none. */
static const char *
rec_name(PyObject *name, Py_ssize_t *len)
{
    const char *bytes;
    if (!PyUnicode_Check(name) || (bytes = PyUnicode_AsUTF8AndSize(name, len)) == NULL) {
        PyErr_Clear();
        return NULL;
    }
    return bytes;
}

PyDoc_STRVAR(record_texts_doc,
"record_texts(text, path, fmt, need=None, /) -> tuple[bytes, ...] | None\n\n"
"The framework records a stored event's data holds, as JSON texts (UTF-8 bytes), cut out of\n"
"text (the data's JSON text, a str) without parsing the rest: follow the object members\n"
"named by path (a tuple of str; of two members of one name the last counts, as a parser\n"
"keeps it) to an object whose \"format\" member is the JSON string fmt and whose \"records\"\n"
"member is an array; its elements' texts. With need, the top object's member of that name\n"
"must be an object too. None when any of that is not so, and when the walk cannot vouch for\n"
"its answer (the caller then parses the text): an empty path, a member name or the format\n"
"written with a backslash escape, a \\u escape of a surrogate anywhere it read (orjson reads\n"
"none), text that is not a JSON object, text orjson would refuse (the walk checks the whole\n"
"grammar; a number that might overflow and nesting past 512 levels are declined too).\n"
"Reference: dsh.adapters._records.python_record_texts.");

/* record_texts on the UTF-8 text [p, p + size) (no lone surrogate in it): the tuple of
 * bytes, None, or NULL with an error set. need may be NULL (none). */
/* The state of one cut_records walk (rec_descend): what it looks for, and the records of the
 * last holder it walked. */
typedef struct {
    PyObject *path;          /* the member names down to the holder (a tuple of str) */
    Py_ssize_t levels;       /* len(path) */
    const char *need;        /* the top member that must be an object, or NULL */
    Py_ssize_t need_len;
    const char *fmt;
    Py_ssize_t fmt_len;
    RecScan scan;
    const char **items;      /* the last holder's records: start, end, start, end, ... */
    Py_ssize_t count, capacity;
} RecDescent;

static int
rec_item(RecDescent *d, const char *start, const char *stop)
{
    if (d->count + 2 > d->capacity) {
        Py_ssize_t want = d->capacity * 2 + 16;
        const char **grown = PyMem_Realloc((void *)d->items, (size_t)want * sizeof(char *));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        d->items = grown;
        d->capacity = want;
    }
    d->items[d->count++] = start;
    d->items[d->count++] = stop;
    return 0;
}

/* The records array at p (its end in *array_end) walked once, its items' spans kept in d;
 * 0, or -1 when it is malformed (no error set) or on an error (set). */
static int
rec_records(const char *p, const char *end, RecDescent *d, Py_ssize_t level,
            const char **array_end)
{
    d->count = 0;
    p = rec_ws(p + 1, end);
    if (p < end && *p == ']') {
        *array_end = p + 1;
        return 0;
    }
    while (p < end) {
        const char *item_end = rec_value_in(p, end, &d->scan, REC_DEPTH - level - 1);
        if (item_end == NULL || rec_item(d, p, item_end) < 0) {
            return -1;
        }
        p = rec_ws(item_end, end);
        if (p < end && *p == ']') {
            *array_end = p + 1;
            return 0;
        }
        if (p >= end || *p != ',') {
            return -1;
        }
        p = rec_ws(p + 1, end);
    }
    return -1;
}

/* One walk of the object at p, `level` members down the path (0: the top object), to its end
 * (*obj_end), its whole grammar checked: the value of the member path[level] (the last of that
 * name counts, as a parser keeps it) is walked by this function one level down when it is an
 * object, in the same pass; at the holder (level == len(path)), the last "format" member must
 * be the JSON string fmt written without escape and the last "records" member an array, whose
 * items' spans are kept in d. Returns 1 when so for the last path member, 0 when not, -1 when
 * the text is to be declined (malformed, an escaped member name on the path; an error set
 * on an error). */
static int
rec_descend(const char *p, const char *end, RecDescent *d, Py_ssize_t level,
            const char **obj_end)
{
    const char *name = NULL;
    Py_ssize_t name_len = 0;
    int found = 0, need_ok = d->need == NULL || level > 0, format_ok = 0, records_ok = 0;
    if (level < d->levels
            && (name = rec_name(PyTuple_GET_ITEM(d->path, level), &name_len)) == NULL) {
        return -1;
    }
    if (p >= end || *p != '{') {
        return -1;
    }
    p = rec_ws(p + 1, end);
    if (p < end && *p == '}') {
        *obj_end = p + 1;
        return 0;
    }
    while (p < end) {
        const char *key = p + 1, *key_end, *value, *value_end = NULL;
        Py_ssize_t key_len;
        int escaped = 0;
        if (*p != '"') {
            return -1;
        }
        key_end = rec_string(p, end, &escaped, &d->scan);
        if (key_end == NULL || escaped) {
            return -1;
        }
        key_len = key_end - 1 - key;
        p = rec_ws(key_end, end);
        if (p >= end || *p != ':') {
            return -1;
        }
        value = rec_ws(p + 1, end);
        if (level < d->levels) {
            if (level == 0 && d->need != NULL && key_len == d->need_len
                    && memcmp(key, d->need, (size_t)key_len) == 0) {
                need_ok = value < end && *value == '{';
            }
            if (key_len == name_len && memcmp(key, name, (size_t)key_len) == 0) {
                if (value < end && *value == '{') {
                    if ((found = rec_descend(value, end, d, level + 1, &value_end)) < 0) {
                        return -1;
                    }
                }
                else {
                    found = 0;
                }
            }
        }
        else if (key_len == 7 && memcmp(key, "records", 7) == 0) {
            records_ok = value < end && *value == '[';
            if (records_ok && rec_records(value, end, d, level, &value_end) < 0) {
                return -1;
            }
        }
        else if (key_len == 6 && memcmp(key, "format", 6) == 0) {
            value_end = rec_value_in(value, end, &d->scan, REC_DEPTH - level);
            format_ok = value_end != NULL && *value == '"'
                && value_end - value - 2 == d->fmt_len
                && memcmp(value + 1, d->fmt, (size_t)d->fmt_len) == 0
                && memchr(value + 1, '\\', (size_t)d->fmt_len) == NULL;
        }
        if (value_end == NULL
                && (value_end = rec_value_in(value, end, &d->scan, REC_DEPTH - level)) == NULL) {
            return -1;
        }
        p = rec_ws(value_end, end);
        if (p < end && *p == '}') {
            *obj_end = p + 1;
            if (level < d->levels) {
                return found && need_ok;
            }
            return format_ok && records_ok;
        }
        if (p >= end || *p != ',') {
            return -1;
        }
        p = rec_ws(p + 1, end);
    }
    return -1;
}

/* record_texts on the UTF-8 text [p, p + size) (no lone surrogate in it): the tuple of
 * bytes, None, or NULL with an error set. need may be NULL (none). One walk of the text:
 * the objects down the path are walked where they lie in their parents' walk. */
static PyObject *
cut_records(const char *p, Py_ssize_t size, PyObject *path, const char *fmt, Py_ssize_t fmt_len,
            PyObject *need)
{
    PyObject *out = NULL;
    const char *end, *obj_end;
    Py_ssize_t i;
    int found;
    RecDescent d = {path, PyTuple_GET_SIZE(path), NULL, 0, fmt, fmt_len, {0}, NULL, 0, 0};
    if (d.levels == 0) {
        Py_RETURN_NONE;  /* the records' holder is a member, never the top object */
    }
    if (need != NULL && need != Py_None
            && (d.need = rec_name(need, &d.need_len)) == NULL) {
        Py_RETURN_NONE;
    }
    end = p + size;
    p = rec_ws(p, end);
    while (end > p && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n'
                       || end[-1] == '\r')) {
        end--;
    }
    found = rec_descend(p, end, &d, 0, &obj_end);
    if (found < 0 && PyErr_Occurred()) {
        PyMem_Free((void *)d.items);
        return NULL;
    }
    if (found <= 0 || obj_end != end || d.scan.surrogate) {
        PyMem_Free((void *)d.items);
        Py_RETURN_NONE;
    }
    out = PyTuple_New(d.count / 2);
    for (i = 0; out != NULL && i < d.count / 2; i++) {
        PyObject *item = PyBytes_FromStringAndSize(d.items[2 * i],
                                                   d.items[2 * i + 1] - d.items[2 * i]);
        if (item == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, item);
    }
    PyMem_Free((void *)d.items);
    if (out != NULL) {
        /* a tuple of bytes alone can hold no cycle: out of the cyclic GC at once, as
         * CPython's own collection would untrack it (the rule in this file's header). A
         * whole-history read keeps one per record (100k for 100k SDK items): tracked, the
         * first young collection after the read walked them all. */
        PyObject_GC_UnTrack(out);
    }
    return out;
}

static PyObject *
record_texts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *text;
    Py_ssize_t size, fmt_len;
    const char *p, *fmt;
    if (nargs < 3 || nargs > 4 || !PyUnicode_Check(args[0]) || !PyTuple_Check(args[1])
            || !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "record_texts(text: str, path: tuple, fmt: str, "
                        "need=None)");
        return NULL;
    }
    text = args[0];
    if (PyTuple_GET_SIZE(args[1]) == 0) {
        Py_RETURN_NONE;  /* the records' holder is a member, never the top object */
    }
    if ((fmt = PyUnicode_AsUTF8AndSize(args[2], &fmt_len)) == NULL) {
        return NULL;
    }
    if (PyUnicode_IS_ASCII(text)) {
        p = (const char *)PyUnicode_1BYTE_DATA(text);
        size = PyUnicode_GET_LENGTH(text);
    }
    else if ((p = PyUnicode_AsUTF8AndSize(text, &size)) == NULL) {
        PyErr_Clear();  /* a lone surrogate in the str: the caller's parse names it */
        Py_RETURN_NONE;
    }
    return cut_records(p, size, args[1], fmt, fmt_len, nargs > 3 ? args[3] : NULL);
}

PyDoc_STRVAR(pick_rows_doc,
"pick_rows(rows, start, stop, seqs, types, paths, fmt, into, /) -> list\n\n"
"The selecting pass of dsh.persistence.sqlite's read_selected over rows already checked\n"
"against their seal records (a list of a read's rows: (rowid, seq, type, time, data,\n"
"source_event_seqs, surface_op, ignorable)). Returns, in order, the rows that pass builds\n"
"events from (seq in seqs, type in types, or ignorable == 0: a packed row), except the ones\n"
"it serves here: a plain row of start <= seq < stop (data a str, surface_op None or\n"
"'\"append\"', ignorable not 0, type not in types) whose type paths (a dict) maps to\n"
"(path, need) and whose records record_texts(data, path, fmt, need) cuts is put as\n"
"into[seq] = that tuple. A row that is no 8-tuple, or a seq that is no int of 64 bits, is\n"
"returned as it is (the Python pass decodes or refuses it). Reference: that pass, which\n"
"runs when the accelerator is not built.");

static PyObject *
pick_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *rows, *seqs, *types, *paths, *into, *out, *zero = NULL;
    long long start, stop;
    Py_ssize_t i, n;
    if (nargs != 8 || !PyList_CheckExact(args[0]) || !PyDict_Check(args[5])
            || !PyUnicode_Check(args[6]) || !PyDict_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "pick_rows(rows: list, start: int, stop: int, seqs, "
                        "types, paths: dict, fmt: str, into: dict)");
        return NULL;
    }
    rows = args[0];
    seqs = args[3];
    types = args[4];
    paths = args[5];
    into = args[7];
    start = PyLong_AsLongLong(args[1]);
    if (start == -1 && PyErr_Occurred()) {
        return NULL;
    }
    stop = PyLong_AsLongLong(args[2]);
    if (stop == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if ((out = PyList_New(0)) == NULL || (zero = PyLong_FromLong(0)) == NULL) {
        Py_XDECREF(out);
        return NULL;
    }
    /* rows is the caller's own list; the containment tests below may run Python (__eq__
     * of odd values), so each row is held while it is looked at */
    n = PyList_GET_SIZE(rows);
    for (i = 0; i < n && i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = Py_NewRef(PyList_GET_ITEM(rows, i));
        PyObject *seq, *etype, *data, *sop, *ign, *where, *cut;
        PyObject *call[4];
        long long seq_value;
        int in_seqs, in_types, packed, overflow = 0;
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 8) {
            goto keep;  /* the Python pass unpacks it, or names what is wrong */
        }
        seq = PyTuple_GET_ITEM(row, 1);
        etype = PyTuple_GET_ITEM(row, 2);
        data = PyTuple_GET_ITEM(row, 4);
        sop = PyTuple_GET_ITEM(row, 6);
        ign = PyTuple_GET_ITEM(row, 7);
        if ((in_seqs = PySequence_Contains(seqs, seq)) < 0
                || (!in_seqs && (in_types = PySequence_Contains(types, etype)) < 0)) {
            goto fail;
        }
        if (in_seqs) {
            in_types = -1;  /* asked below, when it matters */
        }
        if (ign == Py_None) {
            packed = 0;
        }
        else if ((packed = PyObject_RichCompareBool(ign, zero, Py_EQ)) < 0) {
            goto fail;
        }
        if (!in_seqs && !in_types && !packed) {
            Py_DECREF(row);
            continue;  /* not selected */
        }
        if (!in_seqs || packed || !PyLong_CheckExact(seq) || !PyUnicode_CheckExact(data)
                || !(sop == Py_None || (PyUnicode_CheckExact(sop)
                                        && PyUnicode_CompareWithASCIIString(sop, "\"append\"")
                                        == 0))
                || !PyUnicode_CheckExact(etype)) {
            goto keep;
        }
        seq_value = PyLong_AsLongLongAndOverflow(seq, &overflow);
        if (overflow || (seq_value == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            goto keep;
        }
        if (seq_value < start || seq_value >= stop) {
            Py_DECREF(row);
            continue;  /* outside the range: the Python pass skips it too */
        }
        if (in_types < 0 && (in_types = PySequence_Contains(types, etype)) < 0) {
            goto fail;
        }
        if (in_types) {
            goto keep;
        }
        where = PyDict_GetItemWithError(paths, etype);
        if (where == NULL) {
            if (PyErr_Occurred()) {
                goto fail;
            }
            goto keep;  /* a type that holds no records: parsed by the Python pass */
        }
        if (!PyTuple_CheckExact(where) || PyTuple_GET_SIZE(where) != 2
                || !PyTuple_CheckExact(PyTuple_GET_ITEM(where, 0))) {
            PyErr_SetString(PyExc_TypeError, "pick_rows: paths maps a type to (path, need)");
            goto fail;
        }
        call[0] = data;
        call[1] = PyTuple_GET_ITEM(where, 0);
        call[2] = args[6];
        call[3] = PyTuple_GET_ITEM(where, 1);
        if ((cut = record_texts(module, call, 4)) == NULL) {
            goto fail;
        }
        if (cut == Py_None) {
            Py_DECREF(cut);
            goto keep;  /* the cut cannot vouch for it: the Python pass parses the row */
        }
        if (PyDict_SetItem(into, seq, cut) < 0) {
            Py_DECREF(cut);
            goto fail;
        }
        Py_DECREF(cut);
        Py_DECREF(row);
        continue;
    keep:
        if (PyList_Append(out, row) < 0) {
            goto fail;
        }
        Py_DECREF(row);
        continue;
    fail:
        Py_DECREF(row);
        Py_DECREF(zero);
        Py_DECREF(out);
        return NULL;
    }
    Py_DECREF(zero);
    return out;
}

/* ---------------------------------------------------------------------------------------
 * Claude Code imports (docs/interop.md#streaming-imports): the per-line work of the first
 * read and the clock of the mapping. Each function answers the common shape and returns None
 * for anything else; the Python code it shortcuts (dsh.interop._claude_code._Scan.add,
 * BranchIndex.add, dsh.interop._common._utc_millis) stays the reference and runs alone when
 * this module is missing.
 */

static PyObject *cc_type, *cc_uuid, *cc_parent_uuid, *cc_logical_parent_uuid, *cc_subtype,
    *cc_compact_boundary, *cc_message, *cc_content, *cc_id, *cc_tool_use, *cc_tool_result,
    *cc_tool_use_id, *cc_is_sidechain, *cc_data, *cc_agent_progress, *cc_user, *cc_assistant,
    *cc_system, *cc_progress, *cc_summary, *cc_one, *cc_zero, *cc_two, *cc_three;
/* the second read's (claude_blocks below) */
static PyObject *cb_text, *cb_thinking, *cb_signature, *cb_reasoning, *cb_name, *cb_input,
    *cb_arguments, *cb_tool_call, *cb_provider_raw, *cb_provider, *cb_anthropic, *cb_block,
    *cb_empty;
/* claude_usage's: the four counts, [i][0] dsh's key, [i][1] the source's */
static PyObject *cu_keys[4][2];

static int
cc_intern(void)
{
    static const struct { PyObject **var; const char *text; } names[] = {
        {&cc_type, "type"}, {&cc_uuid, "uuid"}, {&cc_parent_uuid, "parentUuid"},
        {&cc_logical_parent_uuid, "logicalParentUuid"}, {&cc_subtype, "subtype"},
        {&cc_compact_boundary, "compact_boundary"}, {&cc_message, "message"},
        {&cc_content, "content"}, {&cc_id, "id"}, {&cc_tool_use, "tool_use"},
        {&cc_tool_result, "tool_result"}, {&cc_tool_use_id, "tool_use_id"},
        {&cc_is_sidechain, "isSidechain"}, {&cc_data, "data"},
        {&cc_agent_progress, "agent_progress"}, {&cc_user, "user"},
        {&cc_assistant, "assistant"}, {&cc_system, "system"}, {&cc_progress, "progress"},
        {&cc_summary, "summary"}, {&cb_text, "text"}, {&cb_thinking, "thinking"},
        {&cb_signature, "signature"}, {&cb_reasoning, "reasoning"}, {&cb_name, "name"},
        {&cb_input, "input"}, {&cb_arguments, "arguments"}, {&cb_tool_call, "tool-call"},
        {&cb_provider_raw, "provider-raw"}, {&cb_provider, "provider"},
        {&cb_anthropic, "anthropic"}, {&cb_block, "block"}, {&cb_empty, ""},
        {&cu_keys[0][0], "inputTokens"}, {&cu_keys[0][1], "input_tokens"},
        {&cu_keys[1][0], "outputTokens"}, {&cu_keys[1][1], "output_tokens"},
        {&cu_keys[2][0], "cacheReadTokens"}, {&cu_keys[2][1], "cache_read_input_tokens"},
        {&cu_keys[3][0], "cacheWriteTokens"},
        {&cu_keys[3][1], "cache_creation_input_tokens"}};
    size_t i;
    if (cc_three != NULL) {
        return 0;
    }
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (*names[i].var == NULL
                && (*names[i].var = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return -1;
        }
    }
    if ((cc_one = PyLong_FromLong(1)) == NULL || (cc_zero = PyLong_FromLong(0)) == NULL
            || (cc_two = PyLong_FromLong(2)) == NULL) {
        return -1;
    }
    cc_three = PyLong_FromLong(3);
    return cc_three == NULL ? -1 : 0;
}

/* value == constant for an exact str value (no other type can equal a str constant here:
 * the records are plain JSON values); -1 with an error set on failure */
static int
cc_equals(PyObject *value, PyObject *constant)
{
    if (value == NULL) {
        return 0;
    }
    if (value == constant) {
        return 1;
    }
    if (!PyUnicode_CheckExact(value)) {
        return 0;
    }
    return PyUnicode_Compare(value, constant) == 0;
}

/* str_or_none: a new reference to value when it is a non-empty str, else NULL (no error) */
static PyObject *
cc_str_or_null(PyObject *value)
{
    if (value != NULL && PyUnicode_Check(value) && PyUnicode_GET_LENGTH(value) > 0) {
        return Py_NewRef(value);
    }
    return NULL;
}

/* BranchIndex's _key: NULL -> None; ASCII str as is; else its UTF-8 bytes (surrogatepass).
 * Steals text. */
static PyObject *
cc_key(PyObject *text)
{
    PyObject *encoded;
    if (text == NULL) {
        Py_RETURN_NONE;
    }
    if (PyUnicode_IS_ASCII(text)) {
        return text;
    }
    encoded = PyUnicode_AsEncodedString(text, "utf-8", "surrogatepass");
    Py_DECREF(text);
    return encoded;
}

/* every content block of kind `wanted` whose `field` is a non-empty str: (line, key, use)
 * appended to tools; -1 on error */
static int
cc_tools(PyObject *content, PyObject *wanted, PyObject *field, PyObject *line, PyObject *use,
         PyObject *tools)
{
    Py_ssize_t i;
    for (i = 0; i < PyList_GET_SIZE(content); i++) {
        PyObject *block = PyList_GET_ITEM(content, i), *id, *row;
        int is;
        if (!PyDict_Check(block)) {
            continue;
        }
        is = cc_equals(PyDict_GetItemWithError(block, cc_type), wanted);
        if (is <= 0) {
            if (PyErr_Occurred()) {
                return -1;
            }
            continue;
        }
        id = cc_str_or_null(PyDict_GetItemWithError(block, field));
        if (id == NULL) {
            if (PyErr_Occurred()) {
                return -1;
            }
            continue;
        }
        id = cc_key(id);
        if (id == NULL) {
            return -1;
        }
        row = PyTuple_Pack(3, line, id, use);
        Py_DECREF(id);
        if (row == NULL || PyList_Append(tools, row) < 0) {
            Py_XDECREF(row);
            return -1;
        }
        Py_DECREF(row);
    }
    return 0;
}

PyDoc_STRVAR(claude_line_doc,
"claude_line(record, rec, line, offset, /) -> (bits, row, tools) | None\n\n"
"What the first read of a Claude Code import keeps of one decoded line (references:\n"
"dsh.interop._claude_code._Scan.add and _claude_code_index.BranchIndex.add): bits 1 = a\n"
"user/assistant line that is not isSidechain, 2 = an inline sidechain candidate, 4 = an\n"
"agent_progress line; row = BranchIndex's lines row (rec, line, offset, kind code, side,\n"
"uuid, link, linked, message id, response key; keys as BranchIndex._key makes them), rec\n"
"being the record number (blank lines not counted) and line the file line; tools = the\n"
"(rec, id, use) rows of its tool_use / tool_result blocks. None for a record that is not a\n"
"dict with a str type, or a summary line: the Python path takes those.");

static PyObject *
claude_line(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *r, *rec, *line, *offset, *kind, *value, *uid = NULL, *link = NULL, *msgid = NULL,
        *rkey = NULL, *tools = NULL, *row = NULL, *code, *msg, *result;
    int sidechain, code_n, bits = 0, linked;
    if (nargs != 4 || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])
            || !PyLong_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "claude_line(record, rec: int, line: int, offset: int)");
        return NULL;
    }
    if (cc_intern() < 0) {
        return NULL;
    }
    r = args[0];
    rec = args[1];
    line = args[2];
    offset = args[3];
    if (!PyDict_CheckExact(r)) {
        Py_RETURN_NONE;
    }
    kind = PyDict_GetItemWithError(r, cc_type);
    if (kind == NULL || !PyUnicode_CheckExact(kind)) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    code_n = cc_equals(kind, cc_user) ? 1 : cc_equals(kind, cc_assistant) ? 2
        : cc_equals(kind, cc_system) ? 3 : 0;
    if (code_n == 0 && cc_equals(kind, cc_summary)) {
        Py_RETURN_NONE;  /* a title: BranchIndex.add writes it at once */
    }
    value = PyDict_GetItemWithError(r, cc_is_sidechain);
    if (value == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        sidechain = 0;
    }
    else if ((sidechain = PyObject_IsTrue(value)) < 0) {
        return NULL;
    }
    if (code_n == 1 || code_n == 2) {
        bits |= sidechain ? 0 : 1;
    }
    uid = cc_str_or_null(PyDict_GetItemWithError(r, cc_uuid));
    if (uid == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (sidechain && uid != NULL) {
        bits |= 2;
    }
    if (cc_equals(kind, cc_progress)) {
        value = PyDict_GetItemWithError(r, cc_data);
        if (value != NULL && PyDict_Check(value)) {
            value = PyDict_GetItemWithError(value, cc_type);
            if (value != NULL && cc_equals(value, cc_agent_progress)) {
                bits |= 4;
            }
        }
        if (PyErr_Occurred()) {
            goto fail;
        }
    }
    link = PyDict_GetItemWithError(r, cc_parent_uuid);
    if (link == NULL || link == Py_None) {
        if (PyErr_Occurred()) {
            goto fail;
        }
        value = PyDict_GetItemWithError(r, cc_subtype);
        if (value != NULL && cc_equals(value, cc_compact_boundary)) {
            link = PyDict_GetItemWithError(r, cc_logical_parent_uuid);
        }
        else {
            link = NULL;
        }
        if (PyErr_Occurred()) {
            goto fail;
        }
    }
    linked = (link == NULL || link == Py_None) ? 0 : PyUnicode_Check(link) ? 1 : 2;
    link = linked == 1 ? Py_NewRef(link) : NULL;
    tools = PyList_New(0);
    if (tools == NULL) {
        goto fail;
    }
    msg = PyDict_GetItemWithError(r, cc_message);
    if (msg != NULL && PyDict_Check(msg)) {
        PyObject *content = PyDict_GetItemWithError(msg, cc_content);
        if (content == NULL && PyErr_Occurred()) {
            goto fail;
        }
        if (code_n == 2) {
            msgid = cc_str_or_null(PyDict_GetItemWithError(msg, cc_id));
            if (msgid == NULL && PyErr_Occurred()) {
                goto fail;
            }
            rkey = msgid != NULL ? Py_NewRef(msgid) : uid != NULL ? Py_NewRef(uid)
                : PyUnicode_FromFormat("line-%S", line);
            if (rkey == NULL) {
                goto fail;
            }
            if (content != NULL && PyList_Check(content)
                    && cc_tools(content, cc_tool_use, cc_id, rec, cc_one, tools) < 0) {
                goto fail;
            }
        }
        else if (code_n == 1 && content != NULL && PyList_Check(content)
                 && cc_tools(content, cc_tool_result, cc_tool_use_id, rec, cc_zero,
                             tools) < 0) {
            goto fail;
        }
    }
    else if (msg == NULL && PyErr_Occurred()) {
        goto fail;
    }
    code = code_n == 1 ? cc_one : code_n == 2 ? cc_two : code_n == 3 ? cc_three : cc_zero;
    row = PyTuple_New(10);
    if (row == NULL) {
        goto fail;
    }
    PyTuple_SET_ITEM(row, 0, Py_NewRef(rec));
    PyTuple_SET_ITEM(row, 1, Py_NewRef(line));
    PyTuple_SET_ITEM(row, 2, Py_NewRef(offset));
    PyTuple_SET_ITEM(row, 3, Py_NewRef(code));
    PyTuple_SET_ITEM(row, 4, Py_NewRef((bits & 2) ? cc_one : cc_zero));
    PyTuple_SET_ITEM(row, 7, Py_NewRef(linked == 0 ? cc_zero : linked == 1 ? cc_one : cc_two));
#define CC_SLOT(i, var) \
    value = cc_key(var); var = NULL; if (value == NULL) { goto fail; } \
    PyTuple_SET_ITEM(row, i, value);
    CC_SLOT(5, uid) CC_SLOT(6, link) CC_SLOT(8, msgid) CC_SLOT(9, rkey)
#undef CC_SLOT
    result = Py_BuildValue("(iNN)", bits, row, tools);
    return result;
fail:
    Py_XDECREF(uid);
    Py_XDECREF(link);
    Py_XDECREF(msgid);
    Py_XDECREF(rkey);
    Py_XDECREF(tools);
    Py_XDECREF(row);
    return NULL;
}

/* days from 0001-01-01 (ordinal 1) to y-m-d, as date.toordinal(); 0 when not a date */
static long
cc_ordinal(int y, int m, int d)
{
    static const int before[13] = {0, 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    static const int days[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    long py = y - 1;
    if (y < 1 || m < 1 || m > 12 || d < 1 || d > days[m] + (m == 2 && leap)) {
        return 0;
    }
    return py * 365 + py / 4 - py / 100 + py / 400 + before[m] + (m > 2 && leap) + d;
}

PyDoc_STRVAR(utc_millis_doc,
"utc_millis(text, /) -> int | None\n\n"
"Epoch milliseconds of an ASCII 'YYYY-MM-DDTHH:MM:SS.mmmZ' as\n"
"dsh.interop._common._utc_millis gives them (its reference: the microseconds over 10**6,\n"
"times 1000, truncated); None for any other text, and for times whose microseconds a double\n"
"does not hold exactly: the Python function then answers.");

static PyObject *
utc_millis(PyObject *module, PyObject *text)
{
    const char *s;
    int i, y, mo, d, h, mi, sec, ms;
    long ordinal;
    long long micros;
    static const int digits[] = {0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 22};
    if (!PyUnicode_Check(text) || PyUnicode_GET_LENGTH(text) != 24 || !PyUnicode_IS_ASCII(text)) {
        Py_RETURN_NONE;
    }
    s = (const char *)PyUnicode_DATA(text);
    if (s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':'
            || s[19] != '.' || s[23] != 'Z') {
        Py_RETURN_NONE;
    }
    for (i = 0; i < (int)(sizeof digits / sizeof digits[0]); i++) {
        if (s[digits[i]] < '0' || s[digits[i]] > '9') {
            Py_RETURN_NONE;
        }
    }
#define CC_NUM2(at) ((s[at] - '0') * 10 + (s[(at) + 1] - '0'))
    y = CC_NUM2(0) * 100 + CC_NUM2(2);
    mo = CC_NUM2(5);
    d = CC_NUM2(8);
    h = CC_NUM2(11);
    mi = CC_NUM2(14);
    sec = CC_NUM2(17);
    ms = CC_NUM2(20) * 10 + (s[22] - '0');
#undef CC_NUM2
    ordinal = cc_ordinal(y, mo, d);
    if (ordinal == 0 || h > 23 || mi > 59 || sec > 59) {
        Py_RETURN_NONE;
    }
    micros = (((long long)(ordinal - 719163) * 86400 + h * 3600 + mi * 60 + sec) * 1000000LL
              + ms * 1000LL);
    if (micros >= (1LL << 53) || micros <= -(1LL << 53)) {
        Py_RETURN_NONE;  /* the Python division is exact on ints a double cannot hold */
    }
    return PyLong_FromLongLong((long long)((double)micros / 1e6 * 1000.0));
}

PyDoc_STRVAR(claude_envelope_doc,
"claude_envelope(record, /) -> dict\n\n"
"A mapped Claude Code line without its message content (reference:\n"
"dsh.interop._claude_code._envelope): a copy of record, keys in order, whose message is a\n"
"copy of it without 'content'; record itself when its message is not a dict.");

static PyObject *
claude_envelope(PyObject *module, PyObject *record)
{
    PyObject *msg, *copy, *inner, *key, *value;
    Py_ssize_t pos = 0;
    if (cc_intern() < 0) {
        return NULL;
    }
    if (!PyDict_Check(record)) {
        PyErr_SetString(PyExc_TypeError, "claude_envelope(dict)");
        return NULL;
    }
    msg = PyDict_GetItemWithError(record, cc_message);
    if (msg == NULL || !PyDict_Check(msg)) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        return Py_NewRef(record);
    }
    inner = PyDict_New();
    if (inner == NULL) {
        return NULL;
    }
    Py_INCREF(msg);  /* held while its items are copied */
    while (PyDict_Next(msg, &pos, &key, &value)) {
        int is = PyObject_RichCompareBool(key, cc_content, Py_NE);
        if (is < 0 || (is && PyDict_SetItem(inner, key, value) < 0)) {
            Py_DECREF(msg);
            Py_DECREF(inner);
            return NULL;
        }
    }
    Py_DECREF(msg);
    copy = PyDict_New();
    if (copy == NULL || PyDict_Update(copy, record) < 0
            || PyDict_SetItem(copy, cc_message, inner) < 0) {
        Py_XDECREF(copy);
        Py_DECREF(inner);
        return NULL;
    }
    Py_DECREF(inner);
    return copy;
}

/* ---------------------------------------------------------------------------------------
 * The second read of a Claude Code import (docs/interop.md#streaming-imports): an assistant
 * line's content blocks and its usage, as dsh.interop._anthropic.anthropic_blocks and
 * anthropic_usage give them for the common shape. None for anything else: the Python
 * functions stay the reference and answer alone when this module is missing.
 */

/* str(block.get(key, "")): a new reference, NULL on error */
static PyObject *
cb_str_field(PyObject *block, PyObject *key)
{
    PyObject *value = PyDict_GetItemWithError(block, key);
    if (value == NULL) {
        return PyErr_Occurred() ? NULL : Py_NewRef(cb_empty);
    }
    return PyUnicode_CheckExact(value) ? Py_NewRef(value) : PyObject_Str(value);
}

/* a new dict of `pairs` (key, value) pairs, values stolen (NULL values: an error already set) */
static PyObject *
cb_dict(Py_ssize_t pairs, PyObject *const *kv)
{
    Py_ssize_t i;
    PyObject *d = NULL;
    for (i = 0; i < pairs; i++) {
        if (kv[2 * i + 1] == NULL) {
            goto done;
        }
    }
    d = _PyDict_NewPresized(pairs);
    for (i = 0; d != NULL && i < pairs; i++) {
        if (PyDict_SetItem(d, kv[2 * i], kv[2 * i + 1]) < 0) {
            Py_CLEAR(d);
        }
    }
done:
    for (i = 0; i < pairs; i++) {
        Py_XDECREF(kv[2 * i + 1]);
    }
    return d;
}

/* json.dumps(v, ensure_ascii=False, separators=(",", ":")) of a plain value into b: exact
 * dicts with ASCII str keys, exact lists, ASCII strs, ints within long long, true, false,
 * null, at most CB_DEPTH deep. 1 done, 0 another value (b left part written), -1 error. */
#define CB_DEPTH 64

static int
cb_ascii(Buf *b, PyObject *s)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), i, run = 0;
    char esc[6] = {'\\', 'u', '0', '0', 0, 0};
    if (buf_put(b, "\"", 1) < 0) {
        return -1;
    }
    for (i = 0; i < n; i++) {
        unsigned char c = p[i];
        const char *short_esc = NULL;
        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;
        }
        if (buf_put(b, (const char *)p + run, i - run) < 0) {
            return -1;
        }
        run = i + 1;
        switch (c) {
        case '"': short_esc = "\\\""; break;
        case '\\': short_esc = "\\\\"; break;
        case '\n': short_esc = "\\n"; break;
        case '\r': short_esc = "\\r"; break;
        case '\t': short_esc = "\\t"; break;
        case '\b': short_esc = "\\b"; break;
        case '\f': short_esc = "\\f"; break;
        default: break;
        }
        if (short_esc != NULL) {
            if (buf_put(b, short_esc, 2) < 0) {
                return -1;
            }
        }
        else {
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            if (buf_put(b, esc, 6) < 0) {
                return -1;
            }
        }
    }
    if (buf_put(b, (const char *)p + run, n - run) < 0) {
        return -1;
    }
    return buf_put(b, "\"", 1);
}

static int
cb_json(Buf *b, PyObject *v, int depth)
{
    Py_ssize_t i, pos = 0;
    PyObject *key, *value;
    int r;
    if (v == Py_None) {
        return buf_put(b, "null", 4) < 0 ? -1 : 1;
    }
    if (v == Py_True) {
        return buf_put(b, "true", 4) < 0 ? -1 : 1;
    }
    if (v == Py_False) {
        return buf_put(b, "false", 5) < 0 ? -1 : 1;
    }
    if (PyUnicode_CheckExact(v)) {
        if (!PyUnicode_IS_ASCII(v)) {
            return 0;
        }
        return cb_ascii(b, v) < 0 ? -1 : 1;
    }
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        return buf_ll(b, x) < 0 ? -1 : 1;
    }
    if (depth >= CB_DEPTH) {
        return 0;
    }
    if (PyList_CheckExact(v)) {
        if (buf_put(b, "[", 1) < 0) {
            return -1;
        }
        for (i = 0; i < PyList_GET_SIZE(v); i++) {
            if (i > 0 && buf_put(b, ",", 1) < 0) {
                return -1;
            }
            r = cb_json(b, PyList_GET_ITEM(v, i), depth + 1);
            if (r <= 0) {
                return r;
            }
        }
        return buf_put(b, "]", 1) < 0 ? -1 : 1;
    }
    if (PyDict_CheckExact(v)) {
        i = 0;
        if (buf_put(b, "{", 1) < 0) {
            return -1;
        }
        while (PyDict_Next(v, &pos, &key, &value)) {
            if (!PyUnicode_CheckExact(key) || !PyUnicode_IS_ASCII(key)) {
                return 0;
            }
            if ((i++ > 0 && buf_put(b, ",", 1) < 0) || cb_ascii(b, key) < 0
                    || buf_put(b, ":", 1) < 0) {
                return -1;
            }
            r = cb_json(b, value, depth + 1);
            if (r <= 0) {
                return r;
            }
        }
        return buf_put(b, "}", 1) < 0 ? -1 : 1;
    }
    return 0;
}

/* encode(input) (the reference's encoder), done here for a plain ASCII value; new ref */
static PyObject *
cb_arguments_of(PyObject *input, PyObject *encode)
{
    Buf b = {NULL, 0, 0};
    int r = cb_json(&b, input, 0);
    PyObject *out = NULL;
    if (r > 0) {
        out = PyUnicode_DecodeASCII(b.data != NULL ? b.data : "", b.size, "strict");
    }
    PyMem_Free(b.data);
    if (r == 0) {
        return PyObject_CallOneArg(encode, input);
    }
    return out;
}

/* Whether claude_blocks maps block b as the reference does (1), or leaves the list to it (0):
 * b is no dict, or an exact dict of exact str keys (so that looking a key up runs no Python
 * code and the borrowed values stay valid) whose "type" is absent or of an exact JSON type
 * (`kind == "text"` compares exact strs only; a str subclass, or an object of its own
 * __eq__, might equal one). *kind: b's type (borrowed), NULL when absent. -1 on error. */
static int
cb_plain_block(PyObject *b, PyObject **kind)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value, *k;
    *kind = NULL;
    if (!PyDict_Check(b)) {
        return 1;
    }
    if (!PyDict_CheckExact(b)) {
        return 0;
    }
    while (PyDict_Next(b, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) {
            return 0;
        }
    }
    k = PyDict_GetItemWithError(b, cc_type);
    if (k == NULL) {
        return PyErr_Occurred() ? -1 : 1;
    }
    if (!PyUnicode_CheckExact(k) && k != Py_None && !PyBool_Check(k) && !PyLong_CheckExact(k)
            && !PyFloat_CheckExact(k) && !PyList_CheckExact(k) && !PyDict_CheckExact(k)) {
        return 0;
    }
    *kind = k;
    return 1;
}

PyDoc_STRVAR(claude_blocks_doc,
"claude_blocks(content, encode, /) -> list | None\n\n"
"dsh.interop._anthropic.anthropic_blocks(content) for a list of blocks (its reference):\n"
"text and thinking blocks with a str text, tool_use blocks (arguments = encode(input), the\n"
"encoder anthropic_blocks uses), tool_result blocks left out, anything else kept as a\n"
"provider-raw block. None when content is not a list, or holds a dict subclass, a dict with\n"
"a key that is not an exact str, or a block whose type is none of str, null, bool, int,\n"
"float, list, dict (exact types): the Python function answers. An error of encode (or of str() of an id or name) propagates as there.");

static PyObject *
claude_blocks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *content, *encode, *out;
    Py_ssize_t i;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "claude_blocks(content, encode)");
        return NULL;
    }
    if (cc_intern() < 0) {
        return NULL;
    }
    content = args[0];
    encode = args[1];
    if (!PyList_CheckExact(content)) {
        Py_RETURN_NONE;
    }
    out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    Py_INCREF(content);  /* held while encode may run Python code */
    for (i = 0; i < PyList_GET_SIZE(content); i++) {
        PyObject *b = PyList_GET_ITEM(content, i), *kind = NULL, *value, *made;
        int plain;
        Py_INCREF(b);
        plain = cb_plain_block(b, &kind);
        if (plain < 0) {
            goto fail_b;
        }
        if (plain == 0) {  /* the reference answers (anything already made is dropped) */
            Py_DECREF(b);
            Py_DECREF(content);
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        if (kind != NULL && cc_equals(kind, cb_text)
                && (value = PyDict_GetItemWithError(b, cb_text)) != NULL
                && PyUnicode_Check(value)) {
            PyObject *kv[] = {cc_type, Py_NewRef(cb_text), cb_text, Py_NewRef(value)};
            made = cb_dict(2, kv);
        }
        else if (kind != NULL && cc_equals(kind, cb_thinking)
                 && (value = PyDict_GetItemWithError(b, cb_thinking)) != NULL
                 && PyUnicode_Check(value)) {
            PyObject *sig = PyDict_GetItemWithError(b, cb_signature);
            int has = sig != NULL && PyUnicode_Check(sig);
            PyObject *kv[] = {cc_type, Py_NewRef(cb_reasoning), cb_text, Py_NewRef(value),
                              cb_signature, has ? Py_NewRef(sig) : NULL};
            if (sig == NULL && PyErr_Occurred()) {
                Py_DECREF(kv[1]);
                Py_DECREF(kv[3]);
                goto fail_b;
            }
            made = cb_dict(has ? 3 : 2, kv);
        }
        else if (PyErr_Occurred()) {
            goto fail_b;
        }
        else if (kind != NULL && cc_equals(kind, cc_tool_use)) {
            PyObject *input, *kv[8];
            kv[0] = cc_type;
            kv[1] = Py_NewRef(cb_tool_call);
            kv[2] = cc_id;
            kv[3] = cb_str_field(b, cc_id);
            kv[4] = cb_name;
            kv[5] = kv[3] != NULL ? cb_str_field(b, cb_name) : NULL;
            kv[6] = cb_arguments;
            kv[7] = NULL;
            if (kv[5] != NULL) {
                input = PyDict_GetItemWithError(b, cb_input);
                if (input != NULL) {
                    Py_INCREF(input);
                }
                else if (!PyErr_Occurred()) {
                    input = PyDict_New();
                }
                if (input != NULL) {
                    kv[7] = cb_arguments_of(input, encode);
                    Py_DECREF(input);
                }
            }
            made = cb_dict(4, kv);
        }
        else if (kind != NULL && cc_equals(kind, cc_tool_result)) {
            Py_DECREF(b);
            continue;
        }
        else {
            PyObject *kv[] = {cc_type, Py_NewRef(cb_provider_raw), cb_provider,
                              Py_NewRef(cb_anthropic), cb_block, Py_NewRef(b)};
            made = cb_dict(3, kv);
        }
        if (made == NULL) {
            goto fail_b;
        }
        if (PyList_Append(out, made) < 0) {
            Py_DECREF(made);
            goto fail_b;
        }
        Py_DECREF(made);
        Py_DECREF(b);
        continue;
fail_b:
        Py_DECREF(b);
        Py_DECREF(content);
        Py_DECREF(out);
        return NULL;
    }
    Py_DECREF(content);
    return out;
}

PyDoc_STRVAR(claude_usage_doc,
"claude_usage(raw, /) -> dict | None\n\n"
"dsh.interop._anthropic.anthropic_usage(raw) for a dict whose four counts (input_tokens,\n"
"output_tokens, cache_read_input_tokens, cache_creation_input_tokens) are each absent, null\n"
"or an int in [0, 2**53 - 1] (its reference: token_usage keeps such an int, counts a null\n"
"input or output 0, leaves out an absent or null cache count). None for anything else: the\n"
"Python function answers.");

static PyObject *
claude_usage(PyObject *module, PyObject *raw)
{
    PyObject *out;
    int i;
    if (cc_intern() < 0) {
        return NULL;
    }
    if (!PyDict_CheckExact(raw)) {
        Py_RETURN_NONE;
    }
    out = _PyDict_NewPresized(4);
    if (out == NULL) {
        return NULL;
    }
    for (i = 0; i < 4; i++) {
        PyObject *value = PyDict_GetItemWithError(raw, cu_keys[i][1]);
        if (value == NULL && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        if (value == NULL || value == Py_None) {
            if (i >= 2) {
                continue;
            }
            value = cc_zero;
        }
        else if (!safe_int_at_least(value, 0, NULL)) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        if (PyDict_SetItem(out, cu_keys[i][0], value) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* ---------------------------------------------------------------------------------------
 * The second read of a Claude Code import in one call a line
 * (docs/interop.md#streaming-imports): claude_map maps the common line (a user text or tool_result line, an assistant
 * line, an off-branch or ignorable line) to its events on the EventBuilder's own state, as
 * dsh.interop._claude_code._map does (its reference). Everything it does not take is left
 * untouched to the reference: it decides first, then writes.
 */

enum {
    CM_EVENTS, CM_LINES, CM_DRAINED, CM_TIME, CM_TIME_SEEN, CM_TURN, CM_TURN_OPEN, CM_STEP,
    CM_STEP_OPEN, CM_STEP_ANSWERED, CM_PENDING, CM_NODES, CM_USER_PROMPTS, CM_TOOL_CALLS,
    CM_MODEL, CM_STEP_CALLS, CM_SOURCE_WRITTEN, CM_FIRST_TIME, CM_SESSION_ID,
    CM_SEQ, CM_DATA, CM_SURFACE_OP, CM_APPEND, CM_IGNORABLE, CM_SOURCE_EVENT_SEQS,
    CM_T_ENVELOPE, CM_T_OFF_BRANCH, CM_T_PROGRESS, CM_T_SNAPSHOT, CM_T_QUEUE, CM_T_SYSTEM,
    CM_T_TURN_START, CM_T_TURN_END, CM_T_STEP_START, CM_T_STEP_END, CM_T_USER, CM_T_ASSISTANT,
    CM_T_CALL, CM_T_RESULT,
    CM_TIMESTAMP, CM_COMPACT_SUMMARY, CM_IS_META, CM_TOOL_USE_RESULT, CM_CLAUDE_CODE, CM_META,
    CM_IS_ERROR_SRC, CM_IS_ERROR, CM_TOOL_CALL_ID, CM_TOOL_RESULT_DSH, CM_CALL_ID, CM_KIND,
    CM_TOOL, CM_ROLE, CM_SOURCE, CM_PLUGIN, CM_CLAUDE_CODE_NAME, CM_MODEL_KEY, CM_USAGE,
    CM_COMPLETED, CM_REASON, CM_SNAPSHOT, CM_QUEUE, CM_INTERRUPT, CM_LOCAL_OUT,
    CM_LOCAL_CAVEAT, CM_LOCAL_ERR, CM_CALL_STEP, CM_CALL_SEQ, CM_STEP_KEY, CM_TURN_KEY,
    CM_COUNT
};
static PyObject *cm[CM_COUNT];

static int
cm_intern(void)
{
    static const char *text[CM_COUNT] = {
        "events", "lines", "_drained", "time", "_time_seen", "turn", "turn_open", "step",
        "step_open", "step_answered", "pending", "nodes", "user_prompts", "tool_calls",
        "model", "_step_calls", "_source_written", "_first_time", "session_id",
        "seq", "data", "surfaceOp", "append", "ignorable", "sourceEventSeqs",
        "import/claude-code/envelope", "import/claude-code/off-branch",
        "import/claude-code/progress", "import/claude-code/file-history-snapshot",
        "import/claude-code/queue-operation", "import/claude-code/system",
        "turn/start", "turn/end", "step/start", "step/end", "user/message",
        "assistant/message", "tool/call", "tool/result",
        "timestamp", "isCompactSummary", "isMeta", "toolUseResult", "claudeCode", "meta",
        "is_error", "isError", "toolCallId", "tool-result", "callId", "kind",
        "tool", "role", "source", "plugin", "claude-code", "model", "usage",
        "completed", "reason", "file-history-snapshot", "queue-operation",
        "[Request interrupted by user", "<local-command-stdout>",
        "<local-command-caveat>", "<local-command-stderr>", "step", "call_seq", "step", "turn"};
    int i;
    if (cc_intern() < 0) {
        return -1;
    }
    if (cm[CM_COUNT - 1] != NULL) {
        return 0;
    }
    for (i = 0; i < CM_COUNT; i++) {
        if (cm[i] == NULL && (cm[i] = PyUnicode_InternFromString(text[i])) == NULL) {
            return -1;
        }
    }
    return 0;
}

/* the quick parse_time of a str: 1 with *ms set, 0 when the reference must answer */
static int
cm_millis(PyObject *text, long long *ms)
{
    PyObject *got;
    long long v;
    int overflow;
    got = utc_millis(NULL, text);
    if (got == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (got == Py_None) {
        Py_DECREF(got);
        return 0;
    }
    v = PyLong_AsLongLongAndOverflow(got, &overflow);
    Py_DECREF(got);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    /* parse_time keeps a quick value in [1e11, 2**53 - 1]; anything else goes around again */
    if (v < 100000000000LL || v > 9007199254740991LL) {
        return 0;
    }
    *ms = v;
    return 1;
}

/* an int of the state (exact int within long long): 1 ok, 0 not */
static int
cm_ll(PyObject *v, long long *out)
{
    int overflow;
    if (v == NULL || !PyLong_CheckExact(v)) {
        return 0;
    }
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* a bool of the state: 1/0, -1 when it is no bool */
static int
cm_bool(PyObject *v)
{
    if (v == Py_True) {
        return 1;
    }
    return v == Py_False ? 0 : -1;
}

/* The builder's state as claude_map reads and writes it (the dict values are borrowed). */
typedef struct {
    PyObject *st, *events, *lines, *nodes, *pending, *line, *sid;
    long long seq, time, turn, step, prompts, calls;
    int seen, turn_open, step_open, answered;
    PyObject *step_calls;  /* a new list when it changed (written back), else NULL */
} CmState;

/* append one event {type, seq, time, data[, sourceEventSeqs][, surfaceOp][, ignorable]};
 * data and seqs are stolen. Returns its seq, -1 on error. */
static long long
cm_emit(CmState *s, PyObject *type, PyObject *data, PyObject *seqs, int append, int ignorable)
{
    PyObject *ev, *seq_o = NULL, *time_o = NULL;
    long long seq = s->seq;
    int bad;
    if (data == NULL) {
        Py_XDECREF(seqs);
        return -1;
    }
    ev = _PyDict_NewPresized(6);
    seq_o = PyLong_FromLongLong(seq);
    time_o = PyLong_FromLongLong(s->time);
    bad = ev == NULL || seq_o == NULL || time_o == NULL
        || PyDict_SetItem(ev, cc_type, type) < 0 || PyDict_SetItem(ev, cm[CM_SEQ], seq_o) < 0
        || PyDict_SetItem(ev, cm[CM_TIME], time_o) < 0
        || PyDict_SetItem(ev, cm[CM_DATA], data) < 0
        || (seqs != NULL && PyDict_SetItem(ev, cm[CM_SOURCE_EVENT_SEQS], seqs) < 0)
        || (append && PyDict_SetItem(ev, cm[CM_SURFACE_OP], cm[CM_APPEND]) < 0)
        || (ignorable && PyDict_SetItem(ev, cm[CM_IGNORABLE], Py_True) < 0)
        || PyList_Append(s->events, ev) < 0 || PyList_Append(s->lines, s->line) < 0
        || (append && PyList_Append(s->nodes, seq_o) < 0);
    Py_XDECREF(ev);
    Py_XDECREF(seq_o);
    Py_XDECREF(time_o);
    Py_DECREF(data);
    Py_XDECREF(seqs);
    if (bad) {
        return -1;
    }
    s->seq++;
    return seq;
}

/* {"turn": t, "step": s} and the like: a new dict of int values */
static PyObject *
cm_turn_step(long long turn, long long step, int with_step)
{
    PyObject *kv[4];
    kv[0] = cm[CM_TURN_KEY];
    kv[1] = PyLong_FromLongLong(turn);
    kv[2] = cm[CM_STEP_KEY];
    kv[3] = with_step ? PyLong_FromLongLong(step) : NULL;
    if (!with_step) {
        return cb_dict(1, kv);
    }
    return cb_dict(2, kv);
}

static int
cm_step_end(CmState *s)
{
    if (cm_emit(s, cm[CM_T_STEP_END], cm_turn_step(s->turn, s->step, 1), NULL, 0, 0) < 0) {
        return -1;
    }
    s->step_open = 0;
    s->answered = 0;
    return 0;
}

/* EventBuilder.end_turn({"kind": "completed"}) with nothing pending */
static int
cm_end_turn(CmState *s)
{
    PyObject *reason, *data, *kv[4];
    if (!s->turn_open) {
        return 0;
    }
    if (s->step_open && cm_step_end(s) < 0) {
        return -1;
    }
    kv[0] = cm[CM_KIND];
    kv[1] = Py_NewRef(cm[CM_COMPLETED]);
    reason = cb_dict(1, kv);
    data = cm_turn_step(s->turn, 0, 0);
    if (reason == NULL || data == NULL || PyDict_SetItem(data, cm[CM_REASON], reason) < 0) {
        Py_XDECREF(reason);
        Py_XDECREF(data);
        return -1;
    }
    Py_DECREF(reason);
    if (cm_emit(s, cm[CM_T_TURN_END], data, NULL, 0, 0) < 0) {
        return -1;
    }
    s->turn_open = 0;
    return 0;
}

/* EventBuilder._open_step (opening a turn first when none is open) */
static int
cm_open_step(CmState *s)
{
    PyObject *calls;
    if (!s->turn_open) {
        s->turn++;
        s->step = 0;
        s->turn_open = 1;
        if (cm_emit(s, cm[CM_T_TURN_START], cm_turn_step(s->turn, 0, 0), NULL, 0, 0) < 0) {
            return -1;
        }
    }
    s->step++;
    s->step_open = 1;
    s->answered = 0;
    if (cm_emit(s, cm[CM_T_STEP_START], cm_turn_step(s->turn, s->step, 1), NULL, 0, 0) < 0) {
        return -1;
    }
    calls = PyList_New(0);
    if (calls == NULL) {
        return -1;
    }
    Py_XSETREF(s->step_calls, calls);
    return 0;
}

/* a message id: id itself, or "<session>:<seq>" when it is NULL (a new reference) */
static PyObject *
cm_message_id(CmState *s, PyObject *id)
{
    if (id != NULL) {
        return Py_NewRef(id);
    }
    return PyUnicode_FromFormat("%U:%lld", s->sid, s->seq);
}

/* result_blocks(content) for a str, null (absent) or a list of exact values: a new list,
 * NULL with no error set when the reference must answer */
static PyObject *
cm_result_blocks(PyObject *content)
{
    PyObject *out, *kv[6];
    Py_ssize_t i;
    if (content == NULL || content == Py_None || PyUnicode_CheckExact(content)) {
        PyObject *text = content != NULL && content != Py_None ? content : cb_empty, *block;
        kv[0] = cc_type;
        kv[1] = Py_NewRef(cb_text);
        kv[2] = cb_text;
        kv[3] = Py_NewRef(text);
        block = cb_dict(2, kv);
        if (block == NULL) {
            return NULL;
        }
        out = PyList_New(1);
        if (out == NULL) {
            Py_DECREF(block);
            return NULL;
        }
        PyList_SET_ITEM(out, 0, block);
        return out;
    }
    if (!PyList_CheckExact(content)) {
        return NULL;
    }
    out = PyList_New(PyList_GET_SIZE(content));
    if (out == NULL) {
        return NULL;
    }
    for (i = 0; i < PyList_GET_SIZE(content); i++) {
        PyObject *part = PyList_GET_ITEM(content, i), *kind = NULL, *text = NULL, *block;
        int plain = cb_plain_block(part, &kind);
        if (plain <= 0) {
            Py_DECREF(out);
            return NULL;  /* (an error stays set) */
        }
        if (PyDict_CheckExact(part) && kind != NULL && cc_equals(kind, cb_text)) {
            text = PyDict_GetItemWithError(part, cb_text);
        }
        if (PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        if (text != NULL && PyUnicode_Check(text)) {
            kv[0] = cc_type;
            kv[1] = Py_NewRef(cb_text);
            kv[2] = cb_text;
            kv[3] = Py_NewRef(text);
            block = cb_dict(2, kv);
        }
        else {
            kv[0] = cc_type;
            kv[1] = Py_NewRef(cb_provider_raw);
            kv[2] = cb_provider;
            kv[3] = Py_NewRef(cb_anthropic);
            kv[4] = cb_block;
            kv[5] = Py_NewRef(part);
            block = cb_dict(3, kv);
        }
        if (block == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, block);
    }
    return out;
}

/* whether text, left-stripped of whitespace, starts with one of the not-typed prefixes */
static int
cm_not_typed(PyObject *text)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), at = 0;
    int kind = PyUnicode_KIND(text), i;
    const void *data = PyUnicode_DATA(text);
    while (at < n && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, at))) {
        at++;
    }
    for (i = CM_LOCAL_OUT; i <= CM_LOCAL_ERR; i++) {
        Py_ssize_t got = PyUnicode_Tailmatch(text, cm[i], at, n, -1);
        if (got != 0) {
            return (int)got;  /* 1, or -1 on error */
        }
    }
    return 0;
}

#define CM_ACTIVE 8
#define CM_LATER_PART 64
#define CM_FIRST_PART 128

PyDoc_STRVAR(claude_map_doc,
"claude_map(state, record, line, rec, flags, repairs, title_line, call, encode, parts, /)\n"
"-> bool\n\n"
"Map one decoded Claude Code line of the second read to its events on an EventBuilder,\n"
"as dsh.interop._claude_code._map does (its reference): state is the builder's __dict__,\n"
"line the file line (each event's source line), rec the record number, flags its\n"
"BranchIndex flags, repairs the chain repairs by uuid, title_line the title's line (0:\n"
"none), call the class of a pending call (PendingCall), encode the tool_use input encoder,\n"
"parts(rec, record) -> the records of the API response the line opens. True when done;\n"
"False, with nothing written, for a line the reference must map (an interrupt, a compact\n"
"summary or boundary, a summary, an unknown type, a repaired link, a result or step close\n"
"that meets an unanswered or unknown call, a block or time of another shape, ...).");

static PyObject *
claude_map(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *st, *r, *line, *rec, *repairs, *call_type, *encode, *parts_fn, *kind, *uid,
        *ts, *v, *msg = NULL, *content = NULL, *envelope = NULL, *blocks = NULL,
        *usage = NULL, *key = NULL, *model = NULL, *source = NULL, *results = NULL,
        *calls_of = NULL, *records = NULL;
    PyObject *ignored_type = NULL;
    long long flags, title, ms = 0, drained;
    int has_ms = 0, typed = 1, off_branch = 0, finish_turn = 0, close_step = 0, i;
    enum { CM_IGNORED, CM_USER, CM_RESULTS, CM_ASSISTANT, CM_LATER } what;
    CmState s = {0};
    PyObject *ret = NULL;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "claude_map(state, record, line, rec, flags, "
                        "repairs, title_line, call, encode, parts)");
        return NULL;
    }
    if (cm_intern() < 0) {
        return NULL;
    }
    st = args[0];
    r = args[1];
    line = args[2];
    rec = args[3];
    repairs = args[5];
    call_type = args[7];
    encode = args[8];
    parts_fn = args[9];
    if (!PyDict_CheckExact(st) || !cm_ll(args[4], &flags) || !cm_ll(args[6], &title)
            || !PyDict_CheckExact(repairs) || !PyLong_CheckExact(line)) {
        PyErr_SetString(PyExc_TypeError, "claude_map: state and repairs dicts, int line, "
                        "flags and title_line");
        return NULL;
    }
    s.st = st;
    s.line = line;
    /* --- decide (nothing is written before every check passed) */
    if (!PyDict_CheckExact(r)) {
        Py_RETURN_FALSE;
    }
    Py_INCREF(r);  /* held: parts() and encode run Python code */
    kind = PyDict_GetItemWithError(r, cc_type);
    if (kind == NULL || !PyUnicode_CheckExact(kind)) {
        goto fallback;
    }
    {
        long long at_line = PyLong_AsLongLong(line);
        if (at_line == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (at_line == title) {
            goto fallback;
        }
    }
    uid = cc_str_or_null(PyDict_GetItemWithError(r, cc_uuid));  /* new ref or NULL */
    if (PyErr_Occurred()) {
        goto done;
    }
    key = uid;  /* owned through key until the end (the assistant's key may replace it) */
    if (uid != NULL && PyDict_GET_SIZE(repairs) > 0) {
        int in = PyDict_Contains(repairs, uid);
        if (in != 0) {
            if (in < 0) {
                goto done;
            }
            goto fallback;
        }
    }
    ts = PyDict_GetItemWithError(r, cm[CM_TIMESTAMP]);
    if (ts == NULL && PyErr_Occurred()) {
        goto done;
    }
    if (ts != NULL && ts != Py_None) {
        if (!PyUnicode_CheckExact(ts)) {
            goto fallback;
        }
        if (PyUnicode_GET_LENGTH(ts) > 0) {
            if (!cm_millis(ts, &ms)) {
                goto fallback;
            }
            has_ms = 1;
        }
    }
    /* the builder's state */
#define CM_GET(k) PyDict_GetItemWithError(st, cm[k])
    s.events = CM_GET(CM_EVENTS);
    s.lines = CM_GET(CM_LINES);
    s.nodes = CM_GET(CM_NODES);
    s.pending = CM_GET(CM_PENDING);
    s.sid = CM_GET(CM_SESSION_ID);
    if (PyErr_Occurred()) {
        goto done;
    }
    if (s.events == NULL || !PyList_CheckExact(s.events) || s.lines == NULL
            || !PyList_CheckExact(s.lines) || s.nodes == NULL || !PyList_CheckExact(s.nodes)
            || s.pending == NULL || !PyDict_CheckExact(s.pending) || s.sid == NULL
            || !PyUnicode_CheckExact(s.sid) || CM_GET(CM_SOURCE_WRITTEN) != Py_True
            || (v = CM_GET(CM_FIRST_TIME)) == NULL || v == Py_None
            || !cm_ll(CM_GET(CM_DRAINED), &drained) || !cm_ll(CM_GET(CM_TIME), &s.time)
            || !cm_ll(CM_GET(CM_TURN), &s.turn) || !cm_ll(CM_GET(CM_STEP), &s.step)
            || !cm_ll(CM_GET(CM_USER_PROMPTS), &s.prompts)
            || !cm_ll(CM_GET(CM_TOOL_CALLS), &s.calls)
            || (s.seen = cm_bool(CM_GET(CM_TIME_SEEN))) < 0
            || (s.turn_open = cm_bool(CM_GET(CM_TURN_OPEN))) < 0
            || (s.step_open = cm_bool(CM_GET(CM_STEP_OPEN))) < 0
            || (s.answered = cm_bool(CM_GET(CM_STEP_ANSWERED))) < 0
            || (v = CM_GET(CM_STEP_CALLS)) == NULL || !PyList_CheckExact(v)
            || (v = CM_GET(CM_MODEL)) == NULL || !PyTuple_CheckExact(v)
            || PyTuple_GET_SIZE(v) != 2) {
        if (PyErr_Occurred()) {
            goto done;
        }
        goto fallback;
    }
#undef CM_GET
    s.seq = drained + PyList_GET_SIZE(s.events);
    if (cc_equals(kind, cc_user) || cc_equals(kind, cc_assistant)) {
        int user = cc_equals(kind, cc_user);
        if (!(flags & CM_ACTIVE)) {
            off_branch = 1;
            what = CM_IGNORED;
            ignored_type = cm[CM_T_OFF_BRANCH];
            goto decided;
        }
        v = PyDict_GetItemWithError(r, cc_message);  /* borrowed: msg owns only a dict */
        if (v == NULL || !PyDict_CheckExact(v)) {
            goto fallback;  /* (an error, or the reference's own) */
        }
        msg = Py_NewRef(v);
        envelope = claude_envelope(NULL, r);
        if (envelope == NULL) {
            goto done;
        }
        if (user) {
            int compact, multi = 0;
            Py_ssize_t n;
            v = PyDict_GetItemWithError(r, cm[CM_COMPACT_SUMMARY]);
            compact = v != NULL ? PyObject_IsTrue(v) : 0;
            if (compact != 0 || PyErr_Occurred()) {
                goto fallback_or_error;
            }
            content = PyDict_GetItemWithError(msg, cc_content);
            if (content == NULL && PyErr_Occurred()) {
                goto done;
            }
            Py_XINCREF(content);
            if (content != NULL && PyList_CheckExact(content)) {
                int any_result = 0, any_other = 0;
                for (n = 0; n < PyList_GET_SIZE(content); n++) {
                    PyObject *b = PyList_GET_ITEM(content, n), *t;
                    if (!PyDict_CheckExact(b)) {
                        if (PyDict_Check(b)) {
                            goto fallback;
                        }
                        any_other = 1;
                        continue;
                    }
                    t = PyDict_GetItemWithError(b, cc_type);
                    if (t == NULL && PyErr_Occurred()) {
                        goto done;
                    }
                    if (t != NULL && !PyUnicode_CheckExact(t) && !PyLong_CheckExact(t)
                            && t != Py_None && !PyBool_Check(t) && !PyFloat_CheckExact(t)
                            && !PyList_CheckExact(t) && !PyDict_CheckExact(t)) {
                        goto fallback;  /* an object that might equal "tool_result" */
                    }
                    if (cc_equals(t, cc_tool_result)) {
                        any_result = 1;
                    }
                    else {
                        any_other = 1;
                    }
                }
                multi = any_result;
                if (any_result && any_other) {
                    goto fallback;  /* results beside other blocks: the reference */
                }
            }
            if (multi) {
                /* a tool_result line: every block answers a pending call of the open step */
                PyObject *tur = PyDict_GetItemWithError(r, cm[CM_TOOL_USE_RESULT]);
                if ((tur == NULL && PyErr_Occurred()) || !s.step_open || uid == NULL) {
                    goto fallback_or_error;
                }
                n = PyList_GET_SIZE(content);
                results = PyList_New(n);
                calls_of = PyList_New(n);
                if (results == NULL || calls_of == NULL) {
                    goto done;
                }
                for (i = 0; i < n; i++) {
                    PyObject *b = PyList_GET_ITEM(content, i), *id, *call, *rb, *err;
                    int is_error, j;
                    id = PyDict_GetItemWithError(b, cc_tool_use_id);
                    if (id == NULL || !PyUnicode_CheckExact(id)) {
                        goto fallback_or_error;
                    }
                    for (j = 0; j < i; j++) {
                        PyObject *other = PyTuple_GET_ITEM(PyList_GET_ITEM(calls_of, j), 0);
                        int same = PyUnicode_Compare(other, id);
                        if (same == 0) {
                            goto fallback;  /* the second is answered by the reference */
                        }
                    }
                    call = PyDict_GetItemWithError(s.pending, id);
                    if (call == NULL) {
                        goto fallback_or_error;
                    }
                    err = PyDict_GetItemWithError(b, cm[CM_IS_ERROR_SRC]);
                    is_error = err != NULL ? PyObject_IsTrue(err) : 0;
                    if (is_error < 0 || PyErr_Occurred()) {
                        goto done;
                    }
                    rb = cm_result_blocks(PyDict_GetItemWithError(b, cc_content));
                    if (rb == NULL) {
                        goto fallback_or_error;
                    }
                    PyList_SET_ITEM(results, i, rb);
                    v = Py_BuildValue("(OOO)", id, call, is_error ? Py_True : Py_False);
                    if (v == NULL) {
                        goto done;
                    }
                    PyList_SET_ITEM(calls_of, i, v);
                }
                what = CM_RESULTS;
                if (tur != NULL) {
                    source = Py_NewRef(tur);  /* (source holds the toolUseResult here) */
                }
                goto decided;
            }
            /* a text line: a str, or a list of text blocks only */
            if (content != NULL && PyUnicode_CheckExact(content)) {
                blocks = cm_result_blocks(content);
                if (blocks == NULL) {
                    goto done;
                }
                v = Py_NewRef(content);
            }
            else if (content != NULL && PyList_CheckExact(content)
                     && PyList_GET_SIZE(content) > 0) {
                PyObject *joined;
                for (n = 0; n < PyList_GET_SIZE(content); n++) {
                    PyObject *b = PyList_GET_ITEM(content, n), *t, *text;
                    if (!PyDict_CheckExact(b)) {
                        goto fallback;
                    }
                    t = PyDict_GetItemWithError(b, cc_type);
                    text = PyDict_GetItemWithError(b, cb_text);
                    if (PyErr_Occurred()) {
                        goto done;
                    }
                    if (!cc_equals(t, cb_text) || text == NULL || !PyUnicode_CheckExact(text)) {
                        goto fallback;
                    }
                }
                blocks = cm_result_blocks(content);
                if (blocks == NULL) {
                    goto fallback_or_error;
                }
                joined = PyUnicode_New(0, 0);
                if (joined == NULL) {
                    goto done;
                }
                for (n = 0; n < PyList_GET_SIZE(content); n++) {
                    PyUnicode_Append(&joined, PyDict_GetItem(PyList_GET_ITEM(content, n),
                                                             cb_text));
                    if (joined == NULL) {
                        goto done;
                    }
                }
                v = joined;
            }
            else {
                goto fallback;
            }
            /* v: the text (a new reference) */
            {
                Py_ssize_t got = PyUnicode_Tailmatch(v, cm[CM_INTERRUPT], 0,
                                                     PyUnicode_GET_LENGTH(v), -1);
                int meta, not_typed;
                if (got != 0) {
                    Py_DECREF(v);
                    goto fallback_or_error;
                }
                not_typed = cm_not_typed(v);
                Py_DECREF(v);
                if (not_typed < 0) {
                    goto done;
                }
                v = PyDict_GetItemWithError(r, cm[CM_IS_META]);
                meta = v != NULL ? PyObject_IsTrue(v) : 0;
                if (meta < 0 || PyErr_Occurred()) {
                    goto done;
                }
                typed = !meta && !not_typed;
            }
            /* EventBuilder.user: a finished turn ends; an answered step closes */
            if (s.turn_open && s.step_open && s.answered && PyDict_GET_SIZE(s.pending) == 0
                    && PyList_GET_SIZE(PyDict_GetItem(st, cm[CM_STEP_CALLS])) == 0) {
                finish_turn = 1;
            }
            else if (s.step_open && s.answered) {
                if (PyDict_GET_SIZE(s.pending) > 0) {
                    goto fallback;  /* unanswered calls get synthetic results there */
                }
                close_step = 1;
            }
            what = CM_USER;
            goto decided;
        }
        /* an assistant line */
        v = PyDict_GetItemWithError(msg, cc_id);
        if (v == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (v != NULL && PyUnicode_Check(v) && PyUnicode_GET_LENGTH(v) > 0) {
            Py_XSETREF(key, Py_NewRef(v));
        }
        else if (key == NULL) {
            goto fallback;  /* "line-N" */
        }
        if (flags & CM_LATER_PART) {
            what = CM_LATER;
            goto decided;
        }
        model = PyDict_GetItemWithError(msg, cm[CM_MODEL_KEY]);
        if (model == NULL && PyErr_Occurred()) {
            goto done;
        }
        model = model != NULL && PyUnicode_Check(model) && PyUnicode_GET_LENGTH(model) > 0
            ? Py_NewRef(model) : NULL;
        if (flags & CM_FIRST_PART) {
            records = PyObject_CallFunctionObjArgs(parts_fn, rec, r, NULL);
            if (records == NULL) {
                goto done;
            }
            if (!PyList_CheckExact(records)) {
                PyErr_SetString(PyExc_TypeError, "claude_map: parts() must return a list");
                goto done;
            }
        }
        else {
            records = PyList_New(1);
            if (records == NULL) {
                goto done;
            }
            PyList_SET_ITEM(records, 0, Py_NewRef(r));
        }
        blocks = PyList_New(0);
        if (blocks == NULL) {
            goto done;
        }
        for (i = 0; i < PyList_GET_SIZE(records); i++) {
            PyObject *one = PyList_GET_ITEM(records, i), *m, *c, *u, *got;
            if (!PyDict_Check(one)) {
                continue;
            }
            if (!PyDict_CheckExact(one)) {
                goto fallback;
            }
            m = PyDict_GetItemWithError(one, cc_message);
            if (m == NULL || !PyDict_Check(m)) {
                if (PyErr_Occurred()) {
                    goto done;
                }
                continue;
            }
            if (!PyDict_CheckExact(m)) {
                goto fallback;
            }
            c = PyDict_GetItemWithError(m, cc_content);
            u = PyDict_GetItemWithError(m, cm[CM_USAGE]);
            if (PyErr_Occurred()) {
                goto done;
            }
            if (c != NULL && PyUnicode_CheckExact(c)) {
                got = cm_result_blocks(c);
            }
            else if (c != NULL && PyList_CheckExact(c)) {
                PyObject *cargs[2] = {c, encode};
                Py_INCREF(c);
                got = claude_blocks(NULL, cargs, 2);
                Py_DECREF(c);
                if (got == Py_None) {
                    Py_DECREF(got);
                    goto fallback;
                }
            }
            else if (c != NULL && PyUnicode_Check(c)) {
                goto fallback;
            }
            else {
                got = PyList_New(0);
            }
            if (got == NULL) {
                goto done;
            }
            if (PyList_SetSlice(blocks, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, got) < 0) {
                Py_DECREF(got);
                goto done;
            }
            Py_DECREF(got);
            if (u != NULL && PyDict_Check(u)) {
                Py_XSETREF(usage, Py_NewRef(u));
            }
        }
        if (usage != NULL) {
            PyObject *made = claude_usage(NULL, usage);
            if (made == NULL) {
                goto done;
            }
            Py_SETREF(usage, made);
            if (usage == Py_None) {
                goto fallback;
            }
        }
        for (i = 0; i < PyList_GET_SIZE(blocks); i++) {
            PyObject *b = PyList_GET_ITEM(blocks, i), *id;
            if (!cc_equals(PyDict_GetItem(b, cc_type), cb_tool_call)) {
                continue;
            }
            id = PyDict_GetItem(b, cc_id);
            if (id == NULL || !PyUnicode_Check(id) || PyUnicode_GET_LENGTH(id) == 0
                    || !PyUnicode_CheckExact(PyDict_GetItem(b, cb_name))) {
                goto fallback;
            }
        }
        if (s.step_open && s.answered) {
            if (PyDict_GET_SIZE(s.pending) > 0) {
                goto fallback;
            }
            close_step = 1;
        }
        what = CM_ASSISTANT;
        goto decided;
    }
    if (cc_equals(kind, cc_progress)) {
        ignored_type = cm[CM_T_PROGRESS];
    }
    else if (cc_equals(kind, cm[CM_SNAPSHOT])) {
        ignored_type = cm[CM_T_SNAPSHOT];
    }
    else if (cc_equals(kind, cm[CM_QUEUE])) {
        ignored_type = cm[CM_T_QUEUE];
    }
    else if (cc_equals(kind, cc_system)) {
        v = PyDict_GetItemWithError(r, cc_subtype);
        if (v == NULL && PyErr_Occurred()) {
            goto done;
        }
        if (cc_equals(v, cc_compact_boundary) && (flags & CM_ACTIVE)) {
            goto fallback;
        }
        if (v != NULL && !PyUnicode_CheckExact(v) && !PyLong_CheckExact(v) && v != Py_None
                && !PyBool_Check(v) && !PyFloat_CheckExact(v) && !PyList_CheckExact(v)
                && !PyDict_CheckExact(v)) {
            goto fallback;
        }
        ignored_type = cm[CM_T_SYSTEM];
    }
    else {
        goto fallback;  /* a summary (a title), an unknown type */
    }
    what = CM_IGNORED;

decided:
    /* --- write: b.at(timestamp), then the line's events */
    if (has_ms && (!s.seen || ms > s.time)) {
        s.time = !s.seen ? (ms > 0 ? ms : 0) : ms;
    }
    s.seen = s.seen || has_ms;
    if (what == CM_IGNORED) {
        if (cm_emit(&s, ignored_type, Py_NewRef(r), NULL, 0, 1) < 0) {
            goto done;
        }
        (void)off_branch;
        goto written;
    }
    if (cm_emit(&s, cm[CM_T_ENVELOPE], envelope, NULL, 0, 1) < 0) {
        envelope = NULL;
        goto done;
    }
    envelope = NULL;
    if (what == CM_LATER) {
        goto written;
    }
    if (what == CM_RESULTS) {
        Py_ssize_t n = PyList_GET_SIZE(results);
        for (i = 0; i < n; i++) {
            PyObject *entry = PyList_GET_ITEM(calls_of, i), *id = PyTuple_GET_ITEM(entry, 0),
                *call = PyTuple_GET_ITEM(entry, 1), *step_o, *seq_o, *kv[10], *block,
                *message, *sidecar, *meta, *data, *seqs, *mid;
            long long call_seq;
            Py_INCREF(call);
            if (PyDict_DelItem(s.pending, id) < 0) {
                Py_DECREF(call);
                goto done;
            }
            step_o = PyObject_GetAttr(call, cm[CM_CALL_STEP]);
            seq_o = step_o != NULL ? PyObject_GetAttr(call, cm[CM_CALL_SEQ]) : NULL;
            Py_DECREF(call);
            if (seq_o == NULL || !cm_ll(seq_o, &call_seq)) {
                Py_XDECREF(step_o);
                Py_XDECREF(seq_o);
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_TypeError, "claude_map: a pending call's seq");
                }
                goto done;
            }
            kv[0] = cc_type; kv[1] = Py_NewRef(cm[CM_TOOL_RESULT_DSH]);
            kv[2] = cm[CM_TOOL_CALL_ID]; kv[3] = Py_NewRef(id);
            kv[4] = cc_content; kv[5] = Py_NewRef(PyList_GET_ITEM(results, i));
            kv[6] = cm[CM_IS_ERROR]; kv[7] = Py_NewRef(PyTuple_GET_ITEM(entry, 2));
            block = cb_dict(4, kv);
            mid = PyUnicode_FromFormat("%U:%U", uid, id);
            kv[0] = cm[CM_KIND]; kv[1] = Py_NewRef(cm[CM_TOOL]);
            kv[2] = cm[CM_CALL_ID]; kv[3] = Py_NewRef(id);
            {
                PyObject *src = cb_dict(2, kv), *content_list = NULL;
                if (block != NULL) {
                    content_list = PyList_New(1);
                    if (content_list != NULL) {
                        PyList_SET_ITEM(content_list, 0, block);
                    }
                    else {
                        Py_DECREF(block);
                    }
                }
                kv[0] = cc_id; kv[1] = mid;
                kv[2] = cm[CM_ROLE]; kv[3] = Py_NewRef(cc_user);
                kv[4] = cm[CM_SOURCE]; kv[5] = src;
                kv[6] = cc_content; kv[7] = content_list;
                message = cb_dict(4, kv);
            }
            kv[0] = cc_uuid; kv[1] = Py_NewRef(uid);
            kv[2] = cm[CM_TOOL_USE_RESULT]; kv[3] = source != NULL ? Py_NewRef(source) : NULL;
            sidecar = cb_dict(source != NULL ? 2 : 1, kv);
            kv[0] = cm[CM_CLAUDE_CODE]; kv[1] = sidecar;
            meta = cb_dict(1, kv);
            kv[0] = cm[CM_TURN_KEY]; kv[1] = PyLong_FromLongLong(s.turn);
            kv[2] = cm[CM_STEP_KEY]; kv[3] = step_o;
            kv[4] = cc_message; kv[5] = message;
            kv[6] = cm[CM_META]; kv[7] = meta;
            data = cb_dict(4, kv);
            seqs = PyList_New(1);
            if (seqs != NULL) {
                PyList_SET_ITEM(seqs, 0, seq_o);
            }
            else {
                Py_DECREF(seq_o);
            }
            if (seqs == NULL || cm_emit(&s, cm[CM_T_RESULT], data, seqs, 1, 0) < 0) {
                if (seqs == NULL) {
                    Py_XDECREF(data);
                }
                goto done;
            }
        }
        goto written;
    }
    if (what == CM_USER) {
        PyObject *kv[8], *mid, *message;
        if (finish_turn && cm_end_turn(&s) < 0) {
            goto done;
        }
        if (close_step && cm_step_end(&s) < 0) {
            goto done;
        }
        if (!s.step_open && cm_open_step(&s) < 0) {
            goto done;
        }
        if (typed) {
            s.prompts++;
            kv[0] = cm[CM_KIND]; kv[1] = Py_NewRef(cc_user);
            source = cb_dict(1, kv);
        }
        else {
            kv[0] = cm[CM_KIND]; kv[1] = Py_NewRef(cm[CM_PLUGIN]);
            kv[2] = cm[CM_PLUGIN]; kv[3] = Py_NewRef(cm[CM_CLAUDE_CODE_NAME]);
            source = cb_dict(2, kv);
        }
        mid = cm_message_id(&s, uid);
        kv[0] = cc_id; kv[1] = mid;
        kv[2] = cm[CM_ROLE]; kv[3] = Py_NewRef(cc_user);
        kv[4] = cc_content; kv[5] = blocks;
        kv[6] = cm[CM_SOURCE]; kv[7] = source;
        blocks = NULL;
        source = NULL;
        message = cb_dict(4, kv);
        if (cm_emit(&s, cm[CM_T_USER], message, NULL, 1, 0) < 0) {
            goto done;
        }
        goto written;
    }
    /* CM_ASSISTANT: EventBuilder.assistant */
    {
        PyObject *kv[8], *message, *data, *mod, *new_model, *names;
        long long seq;
        Py_ssize_t n = PyList_GET_SIZE(blocks);
        if (close_step && cm_step_end(&s) < 0) {
            goto done;
        }
        if (!s.step_open && cm_open_step(&s) < 0) {
            goto done;
        }
        mod = model != NULL ? model
            : PyTuple_GET_ITEM(PyDict_GetItem(st, cm[CM_MODEL]), 1);
        new_model = PyTuple_Pack(2, cb_anthropic, mod);
        if (new_model == NULL || PyDict_SetItem(st, cm[CM_MODEL], new_model) < 0) {
            Py_XDECREF(new_model);
            goto done;
        }
        Py_DECREF(new_model);
        kv[0] = cm[CM_KIND]; kv[1] = Py_NewRef(cm[CM_MODEL_KEY]);
        kv[2] = cb_provider; kv[3] = Py_NewRef(cb_anthropic);
        kv[4] = cm[CM_MODEL_KEY]; kv[5] = Py_NewRef(mod);
        source = cb_dict(3, kv);
        kv[0] = cc_id; kv[1] = Py_NewRef(key);
        kv[2] = cm[CM_ROLE]; kv[3] = Py_NewRef(cc_assistant);
        kv[4] = cc_content; kv[5] = Py_NewRef(blocks);
        kv[6] = cm[CM_SOURCE]; kv[7] = source;
        source = NULL;
        message = cb_dict(4, kv);
        kv[0] = cm[CM_TURN_KEY]; kv[1] = PyLong_FromLongLong(s.turn);
        kv[2] = cm[CM_STEP_KEY]; kv[3] = PyLong_FromLongLong(s.step);
        kv[4] = cc_message; kv[5] = message;
        kv[6] = cm[CM_USAGE]; kv[7] = usage != NULL ? Py_NewRef(usage) : NULL;
        data = cb_dict(usage != NULL ? 4 : 3, kv);
        if (cm_emit(&s, cm[CM_T_ASSISTANT], data, NULL, 1, 0) < 0) {
            goto done;
        }
        names = PyList_New(0);
        if (names == NULL) {
            goto done;
        }
        Py_XSETREF(s.step_calls, names);
        s.answered = 1;
        for (i = 0; i < n; i++) {
            PyObject *b = PyList_GET_ITEM(blocks, i), *id, *name, *args_o, *call, *seq_o;
            if (!cc_equals(PyDict_GetItem(b, cc_type), cb_tool_call)) {
                continue;
            }
            id = PyDict_GetItem(b, cc_id);
            name = PyDict_GetItem(b, cb_name);
            args_o = PyDict_GetItem(b, cb_arguments);
            if (PyList_Append(names, name) < 0) {
                goto done;
            }
            kv[0] = cm[CM_TURN_KEY]; kv[1] = PyLong_FromLongLong(s.turn);
            kv[2] = cm[CM_STEP_KEY]; kv[3] = PyLong_FromLongLong(s.step);
            data = cb_dict(2, kv);
            if (data != NULL && (PyDict_SetItem(data, cm[CM_CALL_ID], id) < 0
                                 || PyDict_SetItem(data, cb_name, name) < 0
                                 || PyDict_SetItem(data, cb_arguments,
                                                   args_o != NULL ? args_o : cb_empty) < 0)) {
                Py_CLEAR(data);
            }
            seq = cm_emit(&s, cm[CM_T_CALL], data, NULL, 0, 0);
            if (seq < 0) {
                goto done;
            }
            seq_o = PyLong_FromLongLong(seq);
            if (seq_o == NULL) {
                goto done;
            }
            {
                PyObject *step_o = PyLong_FromLongLong(s.step);
                call = step_o != NULL
                    ? PyObject_CallFunctionObjArgs(call_type, step_o, seq_o, name, NULL) : NULL;
                Py_XDECREF(step_o);
            }
            Py_DECREF(seq_o);
            if (call == NULL) {
                goto done;
            }
            if ((PyDict_Contains(s.pending, id) == 1 && PyDict_DelItem(s.pending, id) < 0)
                    || PyDict_SetItem(s.pending, id, call) < 0) {
                Py_DECREF(call);
                goto done;
            }
            Py_DECREF(call);
            s.calls++;
        }
    }

written:
    /* the state back into the builder */
    {
        PyObject *vals[9];
        static const int keys[9] = {CM_TIME, CM_TURN, CM_STEP, CM_USER_PROMPTS, CM_TOOL_CALLS,
                                    CM_TIME_SEEN, CM_TURN_OPEN, CM_STEP_OPEN,
                                    CM_STEP_ANSWERED};
        int k, bad = 0;
        vals[0] = PyLong_FromLongLong(s.time);
        vals[1] = PyLong_FromLongLong(s.turn);
        vals[2] = PyLong_FromLongLong(s.step);
        vals[3] = PyLong_FromLongLong(s.prompts);
        vals[4] = PyLong_FromLongLong(s.calls);
        vals[5] = Py_NewRef(s.seen ? Py_True : Py_False);
        vals[6] = Py_NewRef(s.turn_open ? Py_True : Py_False);
        vals[7] = Py_NewRef(s.step_open ? Py_True : Py_False);
        vals[8] = Py_NewRef(s.answered ? Py_True : Py_False);
        for (k = 0; k < 9; k++) {
            if (vals[k] == NULL || PyDict_SetItem(st, cm[keys[k]], vals[k]) < 0) {
                bad = 1;
            }
            Py_XDECREF(vals[k]);
        }
        if (bad || (s.step_calls != NULL
                    && PyDict_SetItem(st, cm[CM_STEP_CALLS], s.step_calls) < 0)) {
            goto done;
        }
    }
    ret = Py_NewRef(Py_True);
    goto done;

fallback_or_error:
    if (PyErr_Occurred()) {
        goto done;
    }
fallback:
    if (!PyErr_Occurred()) {
        ret = Py_NewRef(Py_False);
    }
done:
    Py_DECREF(r);
    Py_XDECREF(msg);
    Py_XDECREF(content);
    Py_XDECREF(envelope);
    Py_XDECREF(blocks);
    Py_XDECREF(usage);
    Py_XDECREF(key);
    Py_XDECREF(model);
    Py_XDECREF(source);
    Py_XDECREF(results);
    Py_XDECREF(calls_of);
    Py_XDECREF(records);
    Py_XDECREF(s.step_calls);
    return ret;
}

/* ---------------------------------------------------------------------------------------
 * The selective read in C (read_rows): SQLite's C API, resolved at run time from the
 * library Python's own _sqlite3 module loaded (no SQLite headers or link at build time).
 */

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#define SQLITE_READER_BUILT 1
#ifndef RTLD_DEFAULT
#define RTLD_DEFAULT ((void *)0)  /* glibc's value, when _GNU_SOURCE did not define it */
#endif
#endif

typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
typedef struct sqlite3_value sqlite3_value;
#define DSH_SQLITE_OK 0
#define DSH_SQLITE_ROW 100
#define DSH_SQLITE_DONE 101
#define DSH_SQLITE_INTEGER 1
#define DSH_SQLITE_TEXT 3
#define DSH_SQLITE_BLOB 4
#define DSH_SQLITE_NULL 5
#define DSH_SQLITE_OPEN_READONLY 0x00000001
#define DSH_SQLITE_OPEN_URI 0x00000040
#define DSH_SQLITE_OPEN_NOMUTEX 0x00008000
#define DSH_SQLITE_TRANSIENT ((void (*)(void *))-1)

typedef struct {
    int bound;
    int (*open_v2)(const char *, sqlite3 **, int, const char *);
    int (*close_v2)(sqlite3 *);
    int (*busy_timeout)(sqlite3 *, int);
    int (*prepare_v2)(sqlite3 *, const char *, int, sqlite3_stmt **, const char **);
    int (*bind_text)(sqlite3_stmt *, int, const char *, int, void (*)(void *));
    int (*bind_int64)(sqlite3_stmt *, int, long long);
    int (*step)(sqlite3_stmt *);
    int (*column_type)(sqlite3_stmt *, int);
    long long (*column_int64)(sqlite3_stmt *, int);
    const unsigned char *(*column_text)(sqlite3_stmt *, int);
    const void *(*column_blob)(sqlite3_stmt *, int);
    int (*column_bytes)(sqlite3_stmt *, int);
    sqlite3_value *(*column_value)(sqlite3_stmt *, int);
    int (*value_type)(sqlite3_value *);
    long long (*value_int64)(sqlite3_value *);
    const unsigned char *(*value_text)(sqlite3_value *);
    const void *(*value_blob)(sqlite3_value *);
    int (*value_bytes)(sqlite3_value *);
    int (*finalize)(sqlite3_stmt *);
} SqliteApi;

static SqliteApi sq;

static PyObject *zlib_crc32 = NULL;

PyDoc_STRVAR(sqlite_bind_doc,
"sqlite_bind(library, /) -> bool\n\n"
"Resolve the SQLite C functions read_rows calls from library (a path: the _sqlite3\n"
"extension module's file, already loaded, whose SQLite they are then), without loading\n"
"anything new (RTLD_NOLOAD). True when every one was found there and is the same function\n"
"the program's global symbols name (when they name one), False when not (None: no file to\n"
"name; a library not loaded; a statically linked SQLite that exports none; another SQLite\n"
"copy in the global symbols; a platform without dlopen). The first library that has them all is the one read_rows\n"
"uses from then on; until one is bound read_rows raises Fallback (the Python read runs).");

static PyObject *
sqlite_bind(PyObject *module, PyObject *library)
{
#ifdef SQLITE_READER_BUILT
    void *handle;
    const char *path = NULL;
    SqliteApi api;
    if (library == Py_None) {
        /* No file to name: dlopen(NULL) would search the global symbols, possibly another
         * copy of SQLite than _sqlite3's (two copies in one process break SQLite's POSIX
         * locks: closing one copy's descriptor drops the other's locks). */
        Py_RETURN_FALSE;
    }
    if (!PyUnicode_Check(library)) {
        PyErr_SetString(PyExc_TypeError, "sqlite_bind(library: str | None)");
        return NULL;
    }
    if ((path = PyUnicode_AsUTF8(library)) == NULL) {
        return NULL;
    }
    handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL) {
        Py_RETURN_FALSE;
    }
    /* Each function must also be the one the global symbols name, when they name one: else
     * _sqlite3 may be calling another copy (the same two-copies hazard). */
#define DSH_SYM(field, name) \
    { \
        void *global_ = dlsym(RTLD_DEFAULT, name); \
        if ((*(void **)&api.field = dlsym(handle, name)) == NULL \
                || (global_ != NULL && global_ != *(void **)&api.field)) { \
            dlclose(handle); \
            Py_RETURN_FALSE; \
        } \
    }
    DSH_SYM(open_v2, "sqlite3_open_v2")
    DSH_SYM(close_v2, "sqlite3_close_v2")
    DSH_SYM(busy_timeout, "sqlite3_busy_timeout")
    DSH_SYM(prepare_v2, "sqlite3_prepare_v2")
    DSH_SYM(bind_text, "sqlite3_bind_text")
    DSH_SYM(bind_int64, "sqlite3_bind_int64")
    DSH_SYM(step, "sqlite3_step")
    DSH_SYM(column_type, "sqlite3_column_type")
    DSH_SYM(column_int64, "sqlite3_column_int64")
    DSH_SYM(column_text, "sqlite3_column_text")
    DSH_SYM(column_blob, "sqlite3_column_blob")
    DSH_SYM(column_bytes, "sqlite3_column_bytes")
    DSH_SYM(column_value, "sqlite3_column_value")
    DSH_SYM(value_type, "sqlite3_value_type")
    DSH_SYM(value_int64, "sqlite3_value_int64")
    DSH_SYM(value_text, "sqlite3_value_text")
    DSH_SYM(value_blob, "sqlite3_value_blob")
    DSH_SYM(value_bytes, "sqlite3_value_bytes")
    DSH_SYM(finalize, "sqlite3_finalize")
#undef DSH_SYM
    if (sq.bound) {
        dlclose(handle);  /* found here too; the library bound first stays in use */
        Py_RETURN_TRUE;
    }
    if (zlib_crc32 == NULL) {
        PyObject *zlib = PyImport_ImportModule("zlib");
        if (zlib == NULL) {
            dlclose(handle);
            return NULL;
        }
        zlib_crc32 = PyObject_GetAttrString(zlib, "crc32");
        Py_DECREF(zlib);
        if (zlib_crc32 == NULL) {
            dlclose(handle);
            return NULL;
        }
    }
    api.bound = 1;
    sq = api;  /* the handle stays open: the library is the _sqlite3 module's */
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

#define READER_CAPSULE "dsh._speedups.sqlite_reader"

static void
reader_close(PyObject *capsule)
{
    sqlite3 *db = PyCapsule_GetPointer(capsule, READER_CAPSULE);
    if (db != NULL && sq.bound) {
        sq.close_v2(db);
    }
}

PyDoc_STRVAR(sqlite_open_doc,
"sqlite_open(uri, /) -> capsule\n\n"
"A read-only SQLite connection of its own to the database at uri (a file: URI), for\n"
"read_rows, in SQLite's multi-thread mode (no mutex per call: the caller uses it from one\n"
"thread at a time); closed when the capsule is freed. A busy database is waited for up to 5 s\n"
"(Python's sqlite3 default). Raises Fallback when sqlite_bind has not succeeded or the open\n"
"fails (the Python read runs and names the failure).");

static PyObject *
sqlite_open(PyObject *module, PyObject *uri)
{
    sqlite3 *db = NULL;
    const char *text;
    PyObject *capsule;
    int rc;
    if (!PyUnicode_Check(uri)) {
        PyErr_SetString(PyExc_TypeError, "sqlite_open(uri: str)");
        return NULL;
    }
    if (!sq.bound) {
        return fallback();
    }
    if ((text = PyUnicode_AsUTF8(uri)) == NULL) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS  /* the open may touch the file; nothing Python inside */
    /* NOMUTEX (SQLite's multi-thread mode for this connection): no mutex taken per column
     * call. Safe because a connection is used by one thread at a time: PageConnections
     * lends each to one page-in under its source's mutex, and the capsule is freed only
     * when no page-in holds it. */
    rc = sq.open_v2(text, &db,
                    DSH_SQLITE_OPEN_READONLY | DSH_SQLITE_OPEN_URI | DSH_SQLITE_OPEN_NOMUTEX,
                    NULL);
    Py_END_ALLOW_THREADS
    if (rc != DSH_SQLITE_OK) {
        if (db != NULL) {
            sq.close_v2(db);
        }
        return fallback();
    }
    sq.busy_timeout(db, 5000);
    capsule = PyCapsule_New(db, READER_CAPSULE, reader_close);
    if (capsule == NULL) {
        sq.close_v2(db);
    }
    return capsule;
}

/* Strict UTF-8 (what Python's sqlite3 decodes a TEXT value with): no overlong form, no
 * surrogate, nothing past U+10FFFF. */
static int
utf8_strict(const unsigned char *p, Py_ssize_t n)
{
    const unsigned char *end = p + n;
    while (p < end) {
        unsigned char c;
        while (end - p >= 8) {
            unsigned long long word;
            memcpy(&word, p, 8);
            if (word & 0x8080808080808080ULL) {
                break;
            }
            p += 8;
        }
        if (p >= end) {
            break;
        }
        c = *p;
        if (c < 0x80) {
            p++;
        }
        else if (c >= 0xC2 && c <= 0xDF) {
            if (end - p < 2 || (p[1] & 0xC0) != 0x80) {
                return 0;
            }
            p += 2;
        }
        else if (c >= 0xE0 && c <= 0xEF) {
            if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80
                    || (c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0)) {
                return 0;
            }
            p += 3;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80
                    || (p[3] & 0xC0) != 0x80 || (c == 0xF0 && p[1] < 0x90)
                    || (c == 0xF4 && p[1] >= 0x90)) {
                return 0;
            }
            p += 4;
        }
        else {
            return 0;
        }
    }
    return 1;
}

/* One column as Python's sqlite3 returns it, for the storage classes read_rows accepts
 * (seal_row_text and row_classes_ok send every other to the Python read). */
static PyObject *
column_object(sqlite3_stmt *stmt, int i)
{
    switch (sq.column_type(stmt, i)) {
    case DSH_SQLITE_INTEGER:
        return PyLong_FromLongLong(sq.column_int64(stmt, i));
    case DSH_SQLITE_TEXT: {
        const char *text = (const char *)sq.column_text(stmt, i);
        return PyUnicode_DecodeUTF8(text, sq.column_bytes(stmt, i), NULL);
    }
    case DSH_SQLITE_BLOB: {
        const void *blob = sq.column_blob(stmt, i);
        return PyBytes_FromStringAndSize(blob, sq.column_bytes(stmt, i));
    }
    case DSH_SQLITE_NULL:
        Py_RETURN_NONE;
    default:
        PyErr_SetString(PyExc_SystemError, "read_rows: a storage class it does not serve");
        return NULL;
    }
}

static PyObject *
row_tuple(sqlite3_stmt *stmt)
{
    int i;
    PyObject *row = PyTuple_New(8);
    if (row == NULL) {
        return NULL;
    }
    for (i = 0; i < 8; i++) {
        PyObject *value = column_object(stmt, i);
        if (value == NULL) {
            Py_DECREF(row);
            return NULL;
        }
        PyTuple_SET_ITEM(row, i, value);
    }
    return row;
}


/* One stepped row's columns 1..7, each read from SQLite once: its class, then its value as
 * that class (no conversion, so no pointer read before is invalidated by a later call). The
 * pass reads a column several times (the seal text, the selection, the cut): one API call
 * each was a ninth of read_rows. Valid until the next step. */
typedef struct {
    int type[8];
    const unsigned char *ptr[8];  /* TEXT or BLOB bytes (NULL: an empty BLOB, or no memory) */
    Py_ssize_t size[8];
    long long num[8];             /* INTEGER */
} Cols;

/* Each column through its sqlite3_value: one sqlite3_column_value call (the statement's
 * checks and its error bookkeeping, once), then the value's class and content from the value
 * itself, which does neither. Three sqlite3_column_* calls a column were a sixth of
 * read_rows. The value is the statement's result register, unprotected (docs of
 * sqlite3_column_value); the connection is in SQLite's multi-thread mode (sqlite_open's
 * NOMUTEX, used by one thread at a time), where protected and unprotected values are one and
 * the same (SQLite's docs of sqlite3_value). Text then its size, blob then its size: the
 * order SQLite's docs give, so no conversion happens between them. */
static void
cols_read(Cols *c, sqlite3_stmt *stmt)
{
    int i;
    for (i = 1; i < 8; i++) {
        sqlite3_value *v = sq.column_value(stmt, i);
        int kind = c->type[i] = sq.value_type(v);
        if (kind == DSH_SQLITE_INTEGER) {
            c->num[i] = sq.value_int64(v);
        }
        else if (kind == DSH_SQLITE_TEXT) {
            c->ptr[i] = sq.value_text(v);
            c->size[i] = sq.value_bytes(v);
        }
        else if (kind == DSH_SQLITE_BLOB) {
            c->ptr[i] = sq.value_blob(v);
            c->size[i] = sq.value_bytes(v);
        }
    }
}

/* A TEXT or NULL column into b as f"{v}" does; 1 when it is another class or not strict
 * UTF-8 (the Python read then runs), -1 on error. */
static int
buf_column_text(Buf *b, const Cols *c, int i)
{
    int kind = c->type[i];
    if (kind == DSH_SQLITE_NULL) {
        return buf_put(b, "None", 4);
    }
    if (kind == DSH_SQLITE_TEXT) {
        const unsigned char *text = c->ptr[i];
        Py_ssize_t n = c->size[i];
        if (text == NULL || !utf8_strict(text, n)) {
            return 1;
        }
        return buf_put(b, (const char *)text, n);
    }
    return 1;
}

/* The seal text of one row (columns 1..7 after the rowid, docs/formats.md#integrity-seals:
 * dsh.persistence._seal.rows_text) appended to meta and payload; 1 when a value is outside
 * the classes a committed row holds (the Python read then runs), -1 on error. The same text
 * is emitted from Python rows by rows_text (above): a change to the one is a change to the
 * other. */
static int
seal_row_text(Buf *meta, Buf *payload, const Cols *c, int first_meta, int first_payload)
{
    int got, kind;
    if ((!first_meta && buf_put(meta, "\x1e", 1) < 0)
            || c->type[1] != DSH_SQLITE_INTEGER
            || c->type[3] != DSH_SQLITE_INTEGER) {
        return PyErr_Occurred() ? -1 : 1;
    }
    if (buf_ll(meta, c->num[1]) < 0 || buf_put(meta, "\x1f", 1) < 0) {
        return -1;
    }
    if ((got = buf_column_text(meta, c, 2)) != 0) {
        return got;
    }
    if (buf_put(meta, "\x1f", 1) < 0 || buf_ll(meta, c->num[3]) < 0
            || buf_put(meta, "\x1f", 1) < 0) {
        return -1;
    }
    if ((got = buf_column_text(meta, c, 6)) != 0) {
        return got;
    }
    if (buf_put(meta, "\x1f", 1) < 0) {
        return -1;
    }
    kind = c->type[7];
    if (kind == DSH_SQLITE_NULL) {
        got = buf_put(meta, "None", 4);
    }
    else if (kind == DSH_SQLITE_INTEGER) {
        got = buf_ll(meta, c->num[7]);
    }
    else {
        return 1;
    }
    if (got < 0 || buf_put(meta, "\x1f", 1) < 0) {
        return -1;
    }
    kind = c->type[5];
    if (kind == DSH_SQLITE_BLOB) {
        const void *blob = c->ptr[5];
        if (buf_hex_raw(meta, blob, c->size[5]) < 0) {
            return -1;
        }
    }
    else if ((got = buf_column_text(meta, c, 5)) != 0) {
        return got;
    }
    if (!first_payload && buf_put(payload, "\x1e", 1) < 0) {
        return -1;
    }
    kind = c->type[4];
    if (kind == DSH_SQLITE_BLOB) {
        const void *blob = c->ptr[4];
        return buf_put(payload, "\x00", 1) < 0
            ? -1 : buf_hex_raw(payload, blob, c->size[4]);
    }
    if (kind != DSH_SQLITE_TEXT) {
        return 1;
    }
    return buf_column_text(payload, c, 4);
}

/* zlib's crc32 with carry-less multiplication (PCLMULQDQ), when the CPU has it: the seal
 * check of a whole-history read runs it over every byte of every row (10k SDK items: ~7 MB,
 * a twelfth of the read's instructions through zlib's table walk). The folding is Intel's
 * ("Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", Gopal et al.), with the
 * constants of the reflected polynomial 0xEDB88320 that Linux's crc32-pclmul and Chromium's
 * zlib use; bytes outside whole 16-byte blocks go through a table. The same value as
 * zlib.crc32 for every input (tests/test_speedups.py checks it against zlib on both paths);
 * DSH_SPEEDUPS_NO_CLMUL=1 keeps zlib's, for tests on a CPU that has it. */
static int use_clmul = 0;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CLMUL_BUILT 1

static uint32_t crc_table[256];

static void
crc_table_fill(void)
{
    uint32_t n, k, c;
    for (n = 0; n < 256; n++) {
        c = n;
        for (k = 0; k < 8; k++) {
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        }
        crc_table[n] = c;
    }
}

/* the running (inverted) crc over n bytes at p, a byte at a time */
static uint32_t
crc_bytes(uint32_t c, const unsigned char *p, size_t n)
{
    while (n--) {
        c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    }
    return c;
}

/* the running (inverted) crc over len bytes at buf: len >= 64 and a multiple of 16 */
__attribute__((target("pclmul,sse4.1")))
static uint32_t
crc_fold(const unsigned char *buf, size_t len, uint32_t crc)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0x0000000000LL, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    /* four 128-bit lanes folded 64 bytes at a time */
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64;
        len -= 64;
    }
    /* the four lanes into one */
    x0 = k3k4;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    /* the 16-byte blocks left */
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, low32);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits */
    x0 = poly;
    x2 = _mm_and_si128(x1, low32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, low32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/* zlib.crc32(data, crc) of n bytes at p (use_clmul only) */
static uint32_t
crc_clmul(uint32_t crc, const unsigned char *p, size_t n)
{
    uint32_t c = ~crc;
    if (n >= 64) {
        size_t blocks = n & ~(size_t)15;
        c = crc_fold(p, blocks, c);
        p += blocks;
        n -= blocks;
    }
    return ~crc_bytes(c, p, n);
}
#endif

/* zlib.crc32(b's', value) of n bytes at s; -1 on error */
static long long
crc_more(const char *s, Py_ssize_t n, PyObject *value)
{
    PyObject *view, *args[2], *got;
    long long crc;
    view = PyMemoryView_FromMemory((char *)(s ? s : ""), n, PyBUF_READ);
    if (view == NULL) {
        return -1;
    }
    args[0] = view;
    args[1] = value;
    got = PyObject_Vectorcall(zlib_crc32, args, value == NULL ? 1 : 2, NULL);
    Py_DECREF(view);
    if (got == NULL) {
        return -1;
    }
    crc = PyLong_AsLongLong(got);
    Py_DECREF(got);
    return crc;
}

/* crc32 of meta + "\x1d" + payload (carry-less when use_clmul, else through zlib.crc32): the
 * meta then the payload from the running value (no copy of the payload, the bulk of the rows'
 * bytes, after the meta); -1 on error */
static long long
seal_crc(Buf *meta, Buf *payload)
{
    PyObject *running;
    long long crc;
    if (buf_put(meta, "\x1d", 1) < 0) {
        return -1;
    }
#ifdef CLMUL_BUILT
    if (use_clmul) {
        uint32_t c = crc_clmul(0, (const unsigned char *)meta->data, (size_t)meta->size);
        return crc_clmul(c, (const unsigned char *)payload->data, (size_t)payload->size);
    }
#endif
    crc = crc_more(meta->data, meta->size, NULL);
    if (crc < 0 || payload->size == 0) {
        return crc;
    }
    if ((running = PyLong_FromLongLong(crc)) == NULL) {
        return -1;
    }
    crc = crc_more(payload->data, payload->size, running);
    Py_DECREF(running);
    return crc;
}

PyDoc_STRVAR(crc32_doc,
"crc32(data, value=0, /) -> int\n\n"
"zlib.crc32(data, value) as read_rows's seal check computes it: by carry-less\n"
"multiplication when CLMUL is 1, else through zlib.crc32 (the same value either way).");

static PyObject *
crc32_twin(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long value = 0;
    PyObject *zlib, *out;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0, /)");
        return NULL;
    }
    if (nargs == 2 && (value = PyLong_AsUnsignedLongMask(args[1])) == (unsigned long)-1
            && PyErr_Occurred()) {
        return NULL;
    }
#ifdef CLMUL_BUILT
    if (use_clmul) {
        Py_buffer view;
        uint32_t c;
        if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
            return NULL;
        }
        c = crc_clmul((uint32_t)value, (const unsigned char *)view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
        return PyLong_FromUnsignedLong(c);
    }
#endif
    if ((zlib = PyImport_ImportModule("zlib")) == NULL) {
        return NULL;
    }
    out = PyObject_CallMethod(zlib, "crc32", "Ok", args[0], (unsigned long)(uint32_t)value);
    Py_DECREF(zlib);
    return out;
}

/* Every column of a row is of a class column_object serves exactly (no REAL: the Python read
 * gives the float) and every TEXT column strict UTF-8 (Python's sqlite3 refuses the row
 * otherwise); 0 sends the read to Python. */
static int
row_classes_ok(const Cols *c)
{
    int i;
    for (i = 2; i < 8; i++) {
        int kind = c->type[i];
        if (kind == DSH_SQLITE_TEXT) {
            if (c->ptr[i] == NULL || !utf8_strict(c->ptr[i], c->size[i])) {
                return 0;
            }
        }
        else if (kind != DSH_SQLITE_INTEGER && kind != DSH_SQLITE_BLOB
                && kind != DSH_SQLITE_NULL) {
            return 0;
        }
    }
    return 1;
}

/* A small cache of the row types met (a log has a few): the str, and whether types holds it. */
#define TYPE_CACHE 16
typedef struct {
    PyObject *name[TYPE_CACHE];
    const char *utf8[TYPE_CACHE];  /* each name's UTF-8, held by the str: compared per row */
    Py_ssize_t size[TYPE_CACHE];
    int in_types[TYPE_CACHE];
    int count;
} TypeCache;

/* The row's type as a str (borrowed from the cache) and *in_types; NULL with an error set,
 * or NULL without one when the type is no strict UTF-8 text. */
static PyObject *
cached_type(TypeCache *cache, const Cols *c, PyObject *types, int *in_types)
{
    const char *text, *have;
    Py_ssize_t n, size;
    int i;
    PyObject *name;
    if (c->type[2] != DSH_SQLITE_TEXT) {
        return NULL;
    }
    text = (const char *)c->ptr[2];
    n = c->size[2];
    if (text == NULL) {
        return NULL;
    }
    for (i = 0; i < cache->count; i++) {
        if (cache->size[i] == n && memcmp(cache->utf8[i], text, (size_t)n) == 0) {
            *in_types = cache->in_types[i];
            return cache->name[i];
        }
    }
    if (!utf8_strict((const unsigned char *)text, n)) {
        return NULL;
    }
    if ((name = PyUnicode_DecodeUTF8(text, n, NULL)) == NULL) {
        return NULL;
    }
    if ((*in_types = PySequence_Contains(types, name)) < 0
            || (have = PyUnicode_AsUTF8AndSize(name, &size)) == NULL) {
        Py_DECREF(name);
        return NULL;
    }
    if (cache->count == TYPE_CACHE) {
        /* a log of many types: the oldest entry makes room */
        Py_DECREF(cache->name[0]);
        memmove(cache->name, cache->name + 1, (TYPE_CACHE - 1) * sizeof(PyObject *));
        memmove(cache->utf8, cache->utf8 + 1, (TYPE_CACHE - 1) * sizeof(const char *));
        memmove(cache->size, cache->size + 1, (TYPE_CACHE - 1) * sizeof(Py_ssize_t));
        memmove(cache->in_types, cache->in_types + 1, (TYPE_CACHE - 1) * sizeof(int));
        cache->count--;
    }
    cache->name[cache->count] = name;
    cache->utf8[cache->count] = have;
    cache->size[cache->count] = size;
    cache->in_types[cache->count++] = *in_types;
    return name;
}

/* read_rows lets the GIL go around the first step and one in this many after it (the
 * prepare always). */
#define STEP_GIL_EVERY 64

PyDoc_STRVAR(read_rows_doc,
"read_rows(conn, sql, session_id, lo, hi, records, start, stop, seqs, types, paths, fmt, /)\n"
"    -> (checked, rows, picked)\n\n"
"dsh.persistence.sqlite's SqlitePrefixSource._verified_rows then pick_rows, on the rows of\n"
"a range read through SQLite's C API (conn: sqlite_open's), without a Python tuple for\n"
"the rows the pass neither keeps nor cuts. sql is _verified_rows's query (the 8 columns;\n"
"its parameters session_id, session_id, lo, hi); records the seal records (first, end, crc)\n"
"to check, in order: each one's rows (first <= seq < end) are joined into the seal text\n"
"(dsh.persistence._seal.rows_text) as they are stepped and checksummed. Returns checked,\n"
"the number of records that checked out: when it is less than len(records), the record\n"
"at that index did not (rows and picked are then None, nothing was cut). Otherwise rows are\n"
"what pick_rows returns for the rows from the one holding start to stop (8-tuples as\n"
"Python's sqlite3 makes them; none when stop <= start), picked a new dict {seq: records}\n"
"of what it cut. Raises\n"
"Fallback when a value is outside the storage classes a committed row holds, a TEXT value\n"
"is no strict UTF-8, or SQLite reports an error: the Python read runs and names it.");

static PyObject *
read_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* args: conn, sql, session_id, lo, hi, records, start, stop, seqs, types, paths, fmt */
    PyObject *records, *seqs, *types, *paths, *kept = NULL, *picked = NULL;
    PyObject *pending = NULL, *result = NULL;
    sqlite3 *db;
    sqlite3_stmt *stmt = NULL;
    const char *sql, *sid, *fmt;
    Py_ssize_t sql_len, sid_len, fmt_len, nrec, r = 0, rec_rows = 0;
    long long lo, hi, start, stop, rec_first = 0, rec_end = 0, rec_crc = 0;
    Buf meta = {NULL, 0, 0}, payload = {NULL, 0, 0};
    TypeCache cache = {{NULL}, {NULL}, {0}, {0}, 0};
    Cols cols;
    int rc, fell = 0, failed = 0, seen_start = 0;
    unsigned int steps = 0;
    if (nargs != 12 || !PyUnicode_Check(args[1]) || !PyUnicode_Check(args[2])
            || !PyList_CheckExact(args[5]) || !PyDict_Check(args[10])
            || !PyUnicode_Check(args[11])) {
        PyErr_SetString(PyExc_TypeError, "read_rows(conn, sql: str, session_id: str, lo: int, "
                        "hi: int, records: list, start: int, stop: int, seqs, types, "
                        "paths: dict, fmt: str)");
        return NULL;
    }
    records = args[5];
    seqs = args[8], types = args[9], paths = args[10];
    if (!sq.bound) {
        return fallback();
    }
    if ((db = PyCapsule_GetPointer(args[0], READER_CAPSULE)) == NULL
            || (sql = PyUnicode_AsUTF8AndSize(args[1], &sql_len)) == NULL
            || (sid = PyUnicode_AsUTF8AndSize(args[2], &sid_len)) == NULL
            || (fmt = PyUnicode_AsUTF8AndSize(args[11], &fmt_len)) == NULL) {
        return NULL;
    }
    if (((lo = PyLong_AsLongLong(args[3])) == -1 && PyErr_Occurred())
            || ((hi = PyLong_AsLongLong(args[4])) == -1 && PyErr_Occurred())
            || ((start = PyLong_AsLongLong(args[6])) == -1 && PyErr_Occurred())
            || ((stop = PyLong_AsLongLong(args[7])) == -1 && PyErr_Occurred())) {
        return NULL;
    }
    nrec = PyList_GET_SIZE(records);
    for (r = 0; r < nrec; r++) {
        PyObject *rec = PyList_GET_ITEM(records, r);
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 3) {
            PyErr_SetString(PyExc_TypeError, "read_rows: records are (first, end, crc)");
            return NULL;
        }
    }
    if ((kept = PyList_New(0)) == NULL || (picked = PyDict_New()) == NULL) {
        goto done;
    }
    /* Without the GIL: on a fresh connection the prepare may wait up to the busy timeout
     * (nothing Python is touched inside). */
    Py_BEGIN_ALLOW_THREADS
    rc = sq.prepare_v2(db, sql, (int)sql_len + 1, &stmt, NULL);
    Py_END_ALLOW_THREADS
    if (rc != DSH_SQLITE_OK
            || sq.bind_text(stmt, 1, sid, (int)sid_len, DSH_SQLITE_TRANSIENT) != DSH_SQLITE_OK
            || sq.bind_text(stmt, 2, sid, (int)sid_len, DSH_SQLITE_TRANSIENT) != DSH_SQLITE_OK
            || sq.bind_int64(stmt, 3, lo) != DSH_SQLITE_OK
            || sq.bind_int64(stmt, 4, hi) != DSH_SQLITE_OK) {
        fell = 1;
        goto done;
    }
    r = -1;  /* the record being joined: none yet */
#define NEXT_RECORD() do { \
        PyObject *rec_ = PyList_GET_ITEM(records, r); \
        rec_first = PyLong_AsLongLong(PyTuple_GET_ITEM(rec_, 0)); \
        rec_end = PyLong_AsLongLong(PyTuple_GET_ITEM(rec_, 1)); \
        rec_crc = PyLong_AsLongLong(PyTuple_GET_ITEM(rec_, 2)); \
        if (PyErr_Occurred()) goto done; \
        meta.size = payload.size = 0; \
        rec_rows = 0; \
    } while (0)
    /* the record checked when its end is passed; a record of no row checksums "\x1d" */
#define CLOSE_RECORD() do { \
        long long crc_ = seal_crc(&meta, &payload); \
        if (crc_ < 0) goto done; \
        if (crc_ != rec_crc) { failed = 1; goto done; } \
    } while (0)
    if (nrec > 0) {
        r = 0;
        NEXT_RECORD();
    }
    for (;;) {
        long long seq;
        int in_seqs, in_types = 0, packed, got, plain;
        PyObject *etype, *seq_obj, *where, *cut;
        /* The GIL is let go around the first step and every STEP_GIL_EVERY-th after it.
         * The first step takes SQLite's read lock and may wait up to the busy timeout for
         * a writer (with the schema already read, as on a connection used before, the
         * prepare does not): it never holds the GIL. Once the lock is held a step reads
         * without waiting on another connection; one release and take per row was a sixth
         * of a whole-history read (275k rows for 100k SDK items), so another thread waits
         * at most STEP_GIL_EVERY - 1 rows' reading, never a lock wait. */
        if ((steps++ % STEP_GIL_EVERY) == 0) {
            Py_BEGIN_ALLOW_THREADS
            rc = sq.step(stmt);
            Py_END_ALLOW_THREADS
        }
        else {
            rc = sq.step(stmt);
        }
        if (rc == DSH_SQLITE_DONE) {
            break;
        }
        if (rc != DSH_SQLITE_ROW) {
            fell = 1;
            goto done;
        }
        cols_read(&cols, stmt);
        if (cols.type[1] != DSH_SQLITE_INTEGER) {
            fell = 1;
            goto done;
        }
        seq = cols.num[1];
        /* the seal: close the records this row is past, join it into the one holding it */
        while (r >= 0 && r < nrec && seq >= rec_end) {
            CLOSE_RECORD();
            if (++r < nrec) {
                NEXT_RECORD();
            }
        }
        if (r >= 0 && r < nrec && seq >= rec_first) {
            if ((got = seal_row_text(&meta, &payload, &cols, rec_rows == 0, rec_rows == 0)) != 0) {
                fell = got > 0;
                goto done;
            }
            rec_rows++;
        }
        else if (!row_classes_ok(&cols)) {
            fell = 1;  /* a REAL, or a row Python's sqlite3 refuses: the Python read */
            goto done;
        }
        if (seq >= stop || start >= stop) {
            continue;  /* past the range (or none): checked, not served */
        }
        /* the pass (pick_rows) over the rows from the one holding start */
        if (seq <= start && pending != NULL) {
            Py_CLEAR(pending);  /* a later row holds start */
        }
        if (seq > start && !seen_start) {
            seen_start = 1;
            if (pending != NULL) {
                if (PyList_Append(kept, pending) < 0) {
                    goto done;
                }
                Py_CLEAR(pending);
            }
        }
        packed = cols.type[7] == DSH_SQLITE_INTEGER && cols.num[7] == 0;
        if (seq < start) {
            if (packed && (pending = row_tuple(stmt)) == NULL) {
                goto done;  /* the row that may hold start: its members, if it does */
            }
            continue;  /* a plain row before the range: the pass skips it */
        }
        if ((seq_obj = PyLong_FromLongLong(seq)) == NULL) {
            goto done;
        }
        in_seqs = PySequence_Contains(seqs, seq_obj);
        if (in_seqs < 0) {
            Py_DECREF(seq_obj);
            goto done;
        }
        etype = cached_type(&cache, &cols, types, &in_types);
        if (etype == NULL && PyErr_Occurred()) {
            Py_DECREF(seq_obj);
            goto done;
        }
        if (etype == NULL && cols.type[2] != DSH_SQLITE_NULL) {
            Py_DECREF(seq_obj);
            fell = 1;  /* a type of another class or no strict UTF-8: the Python read */
            goto done;
        }
        if (etype == NULL) {  /* NULL: as the pass asks None */
            if ((in_types = PySequence_Contains(types, Py_None)) < 0) {
                Py_DECREF(seq_obj);
                goto done;
            }
        }
        if (!in_seqs && !in_types && !packed) {
            Py_DECREF(seq_obj);
            continue;  /* not selected */
        }
        plain = etype != NULL && cols.type[4] == DSH_SQLITE_TEXT;
        if (plain) {
            int sop = cols.type[6];
            if (sop == DSH_SQLITE_TEXT) {
                plain = cols.size[6] == 8 && memcmp(cols.ptr[6], "\"append\"", 8) == 0;
            }
            else {
                plain = sop == DSH_SQLITE_NULL;
            }
        }
        if (!in_seqs || packed || !plain || in_types) {
            goto keep;
        }
        where = PyDict_GetItemWithError(paths, etype);
        if (where == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(seq_obj);
                goto done;
            }
            goto keep;  /* a type that holds no records: parsed by the Python pass */
        }
        if (!PyTuple_CheckExact(where) || PyTuple_GET_SIZE(where) != 2
                || !PyTuple_CheckExact(PyTuple_GET_ITEM(where, 0))) {
            Py_DECREF(seq_obj);
            PyErr_SetString(PyExc_TypeError, "read_rows: paths maps a type to (path, need)");
            goto done;
        }
        {
            /* (strict UTF-8 already: seal_row_text or row_classes_ok checked every TEXT
             * column of this row above) */
            const unsigned char *text = cols.ptr[4];
            Py_ssize_t n = cols.size[4];
            if (text == NULL) {
                Py_DECREF(seq_obj);
                fell = 1;
                goto done;
            }
            cut = cut_records((const char *)text, n, PyTuple_GET_ITEM(where, 0), fmt, fmt_len,
                              PyTuple_GET_ITEM(where, 1));
        }
        if (cut == NULL) {
            Py_DECREF(seq_obj);
            goto done;
        }
        if (cut == Py_None) {
            Py_DECREF(cut);
            goto keep;  /* the cut cannot vouch for it: the Python pass parses the row */
        }
        got = PyDict_SetItem(picked, seq_obj, cut);
        Py_DECREF(cut);
        Py_DECREF(seq_obj);
        if (got < 0) {
            goto done;
        }
        continue;
    keep:
        Py_DECREF(seq_obj);
        {
            PyObject *row = row_tuple(stmt);
            if (row == NULL || PyList_Append(kept, row) < 0) {
                Py_XDECREF(row);
                if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    PyErr_Clear();
                    fell = 1;
                }
                goto done;
            }
            Py_DECREF(row);
        }
    }
    /* the records past the last row (their rows are missing: a checksum of none) */
    while (r >= 0 && r < nrec) {
        CLOSE_RECORD();
        if (++r < nrec) {
            NEXT_RECORD();
        }
    }
    if (pending != NULL) {
        if (PyList_Append(kept, pending) < 0) {
            goto done;
        }
        Py_CLEAR(pending);
    }
    result = Py_BuildValue("(nOO)", nrec, kept, picked);
#undef NEXT_RECORD
#undef CLOSE_RECORD
done:
    if (stmt != NULL) {
        sq.finalize(stmt);
    }
    PyMem_Free(meta.data);
    PyMem_Free(payload.data);
    for (int i = 0; i < cache.count; i++) {
        Py_DECREF(cache.name[i]);
    }
    Py_XDECREF(pending);
    if (failed && !PyErr_Occurred()) {
        result = Py_BuildValue("(nOO)", r, Py_None, Py_None);
    }
    Py_XDECREF(kept);
    Py_XDECREF(picked);
    if (fell && !PyErr_Occurred()) {
        return fallback();
    }
    return result;
}

/* ---------------------------------------------------------------------------------------
 * The seal of one durable SQLite batch (docs/formats.md#integrity-seals and #the-seal-chain):
 * its page records and the bytes appended to the seal file in one call, and a chain record's
 * hash. dsh.persistence._seal.row_records / append_batch_to and ChainRecord.encode stay the
 * reference: seal_batch raises Fallback for anything they would treat otherwise.
 */

/* 1 and the row's seq (an exact int >= 0 in column 0 of a tuple), else 0 */
static int
seal_row_seq(PyObject *row, long long *seq)
{
    int overflow;
    PyObject *v;
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < 1) {
        return 0;
    }
    v = PyTuple_GET_ITEM(row, 0);
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    *seq = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || *seq < 0) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* zlib.crc32 of n bytes at p (carry-less when use_clmul); -1 on error */
static long long
seal_bytes_crc(const char *p, Py_ssize_t n)
{
#ifdef CLMUL_BUILT
    if (use_clmul) {
        return crc_clmul(0, (const unsigned char *)p, (size_t)n);
    }
#endif
    return crc_more(p, n, NULL);
}

/* zlib.crc32 for crc_more off the CLMUL path (sqlite_bind sets it for the C read; a writer
 * may seal before any read bound SQLite); -1 on error */
static int
seal_zlib_ready(void)
{
    PyObject *zlib;
    if (zlib_crc32 != NULL) {
        return 0;
    }
    if ((zlib = PyImport_ImportModule("zlib")) == NULL) {
        return -1;
    }
    zlib_crc32 = PyObject_GetAttrString(zlib, "crc32");
    Py_DECREF(zlib);
    return zlib_crc32 == NULL ? -1 : 0;
}

static void
seal_le(unsigned char *p, unsigned long long v, int n)
{
    int k;
    for (k = 0; k < n; k++) {
        p[k] = (unsigned char)(v >> (8 * k));
    }
}

PyDoc_STRVAR(seal_batch_doc,
"seal_batch(rows, start, end, page_events, hashed, keys, /) -> (records, data)\n\n"
"The seal of one batch of SQLite rows of seqs [start, end): records as\n"
"dsh.persistence._seal.row_records(rows, start, end) gives them (one (start, end, crc) a\n"
"page of page_events seqs), and data, the bytes append_batch_to writes for them: each record\n"
"packed '<QQI', then, when hashed (bytes) is given, the chain record framed as\n"
"ChainRecord.encode frames hashed + keys. rows is a list of (seq, type, time, data,\n"
"source_event_seqs, surface_op, ignorable) in seq order. Raises Fallback for anything the\n"
"Python path treats otherwise (a row of another shape, a seq that is no int >= 0).");

static PyObject *
seal_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Buf text = {NULL, 0, 0}, out = {NULL, 0, 0};
    PyObject *rows, *hashed, *keys, *records = NULL, *record, *result = NULL;
    long long start, end, page, lo, hi, seq, next, crc;
    Py_ssize_t i, j, count;
    unsigned char packed[20];
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "seal_batch(rows, start, end, page_events, hashed, keys)");
        return NULL;
    }
    rows = args[0];
    hashed = args[4];
    keys = args[5];
    if (!PyList_CheckExact(rows) || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])
            || !PyLong_CheckExact(args[3])
            || (hashed != Py_None && (!PyBytes_CheckExact(hashed) || !PyBytes_CheckExact(keys)))) {
        return fallback();
    }
    start = PyLong_AsLongLong(args[1]);
    end = PyLong_AsLongLong(args[2]);
    page = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return fallback();
    }
    if (start < 0 || end < 0 || page <= 0) {
        return fallback();  /* struct.pack's errors, the Python path's */
    }
    if (!use_clmul && seal_zlib_ready() < 0) {
        return NULL;
    }
    if ((records = PyList_New(0)) == NULL) {
        return NULL;
    }
    count = PyList_GET_SIZE(rows);  /* the loops below run no Python code: the list holds */
    lo = start;
    i = 0;
    do {
        if (count == 0) {
            j = 0;
            hi = end;  /* rows_crc([]): no rows, the record spans the batch */
        }
        else {
            if (!seal_row_seq(PyList_GET_ITEM(rows, i), &seq)) {
                goto fell;
            }
            if (seq > LLONG_MAX / 2 - page) {
                goto fell;
            }
            hi = (seq / page + 1) * page;
            for (j = i + 1; j < count; j++) {
                if (!seal_row_seq(PyList_GET_ITEM(rows, j), &next)) {
                    goto fell;
                }
                if (next >= hi) {
                    break;
                }
            }
            if (j == count) {
                hi = end;
            }
        }
        text.size = 0;
        if (seal_text(&text, rows, i, j, 0) < 0
                || (crc = seal_bytes_crc(text.data, text.size)) < 0) {
            goto fail;
        }
        record = Py_BuildValue("(LLL)", lo, hi, crc);
        if (record == NULL || PyList_Append(records, record) < 0) {
            Py_XDECREF(record);
            goto fail;
        }
        Py_DECREF(record);
        seal_le(packed, (unsigned long long)lo, 8);
        seal_le(packed + 8, (unsigned long long)hi, 8);
        seal_le(packed + 16, (unsigned long long)crc, 4);
        if (buf_put(&out, (const char *)packed, 20) < 0) {
            goto fail;
        }
        lo = hi;
        i = j;
    } while (i < count);
    if (hashed != Py_None) {
        Py_ssize_t at = out.size, hashed_len = PyBytes_GET_SIZE(hashed);
        Py_ssize_t length = hashed_len + PyBytes_GET_SIZE(keys);
        unsigned char frame[20] = {0};
        if (length > 0xFFFFFFFFLL) {
            goto fell;
        }
        /* the frame's room first, then the payload; its crc once the payload is in place */
        if (buf_put(&out, (const char *)frame, 20) < 0
                || buf_put(&out, PyBytes_AS_STRING(hashed), hashed_len) < 0
                || buf_put(&out, PyBytes_AS_STRING(keys), PyBytes_GET_SIZE(keys)) < 0) {
            goto fail;
        }
        if ((crc = seal_bytes_crc(out.data + at + 20, length)) < 0) {
            goto fail;
        }
        seal_le(frame, 0xFFFFFFFFFFFFFFFEULL, 8);  /* CHAIN_MARK */
        seal_le(frame + 8, (unsigned long long)length, 4);
        seal_le(frame + 12, (unsigned long long)hashed_len, 4);
        seal_le(frame + 16, (unsigned long long)crc, 4);
        memcpy(out.data + at, frame, 20);
    }
    result = Py_BuildValue("(Oy#)", records, out.data ? out.data : "", out.size);
    goto fail;  /* the common exit: free the buffers */
fell:
    fallback();
fail:
    Py_XDECREF(records);
    PyMem_Free(text.data);
    PyMem_Free(out.data);
    return result;
}

PyDoc_STRVAR(chain_hash_doc,
"chain_hash(hashed, sha256, /) -> bytes\n\n"
"A seal chain record's hash: SHA-256(b'dsh-seal-chain\\x00' + hashed), by the CPU's SHA\n"
"extensions when SHA_NI is 1, else through sha256 (hashlib.sha256).");

static PyObject *
chain_hash(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Buf b = {NULL, 0, 0};
    unsigned char digest[32];
    PyObject *out = NULL;
    if (nargs != 2 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "chain_hash(hashed: bytes, sha256)");
        return NULL;
    }
    if (buf_put(&b, "dsh-seal-chain\0", 15) == 0
            && buf_put(&b, PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0])) == 0
            && sha256_into(args[1], b.data, b.size, digest) == 0) {
        out = PyBytes_FromStringAndSize((const char *)digest, 32);
    }
    PyMem_Free(b.data);
    return out;
}

/* The restore fold's loop over a durable batch (dsh.session._restore_state.RestoreFold.feed,
 * the reference): the events that need none of its Python. */

/* 1 when the event type's [] and get() are dict's: a dict, or a FrozenDict class (Event)
 * that overrides neither (a heap subclass of dict reaches dict's __getitem__ through a slot
 * wrapper, so the slot pointers differ: the methods are looked up, once per class) */
static PyTypeObject *fold_type_ok = NULL;

static int
fold_event_type_ok(PyTypeObject *t)
{
    static PyObject *getitem = NULL, *get = NULL;
    if (t == &PyDict_Type || t == fold_type_ok) {
        return 1;
    }
    if (!PyType_IsSubtype(t, frozen_dict_type)) {
        return 0;
    }
    if (getitem == NULL && (getitem = PyUnicode_InternFromString("__getitem__")) == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (get == NULL && (get = PyUnicode_InternFromString("get")) == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (_PyType_Lookup(t, getitem) != _PyType_Lookup(&PyDict_Type, getitem)
            || _PyType_Lookup(t, get) != _PyType_Lookup(&PyDict_Type, get)) {
        return 0;
    }
    Py_INCREF(t);
    Py_XSETREF(fold_type_ok, t);
    return 1;
}

PyDoc_STRVAR(fold_plain_doc,
"fold_plain(events, count, surface_types, stop_types, /) -> (index, count, last_time,\n"
"    last_type, boundary, turn_open, last_turn, appended)\n\n"
"RestoreFold.feed over the list events up to the first event it leaves to the Python loop\n"
"(index: a surface replace, an event whose type is in stop_types, or an event of another\n"
"shape than a committed one). Events whose seq is below count are skipped.\n"
"count, last_time and last_type are those of the last event folded (count unchanged and the\n"
"others None when none was), boundary and turn_open those of the last turn/start or turn/end\n"
"(None, False when none was met), last_turn the turn of the last turn/start (None when none\n"
"was met) and appended the seqs of the surface appends, in order.");

static PyObject *
fold_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *events, *types, *stops, *appended, *result = NULL;
    PyObject *last_time = Py_None, *last_type = Py_None, *boundary = Py_None;
    PyObject *turn_open = Py_False, *last_turn = Py_None, *zero = NULL;
    long long count, seq;
    Py_ssize_t i, n;
    int overflow, found;
    if (!configured()) {
        return NULL;
    }
    if (nargs != 4 || !PyList_CheckExact(args[0]) || !PyLong_CheckExact(args[1])
            || !PyAnySet_Check(args[2]) || !PyAnySet_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "fold_plain(events: list, count: int, "
                        "surface_types: frozenset, stop_types: frozenset)");
        return NULL;
    }
    events = args[0];
    types = args[2];
    stops = args[3];
    count = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow || (count == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "fold_plain: count out of range");
        return NULL;
    }
    if ((appended = PyList_New(0)) == NULL || (zero = PyLong_FromLong(0)) == NULL) {
        goto done;
    }
    /* no Python code runs in the loop (exact str keys of dicts whose lookup is dict's, an
     * exact str in a set): the list and the events hold every object borrowed here */
    n = PyList_GET_SIZE(events);
    for (i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(events, i), *seq_obj, *etype, *etime, *op, *turn = NULL;
        int start = 0;
        if (!PyDict_Check(e) || !fold_event_type_ok(Py_TYPE(e))) {
            break;
        }
        seq_obj = PyDict_GetItemWithError(e, s_seq);
        if (seq_obj == NULL || !PyLong_CheckExact(seq_obj)) {
            if (PyErr_Occurred()) {
                goto done;
            }
            break;
        }
        seq = PyLong_AsLongLongAndOverflow(seq_obj, &overflow);
        if (overflow || (seq == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            break;
        }
        if (seq < count) {
            continue;  /* covered already: a retried batch */
        }
        etype = PyDict_GetItemWithError(e, s_type);
        etime = etype == NULL ? NULL : PyDict_GetItemWithError(e, s_time);
        if (etype == NULL || etime == NULL || !PyUnicode_CheckExact(etype)) {
            if (PyErr_Occurred()) {
                goto done;
            }
            break;
        }
        if ((found = PySet_Contains(types, etype)) < 0) {
            goto done;
        }
        if (found) {
            op = PyDict_GetItemWithError(e, s_surface_op);
            if (op == NULL && PyErr_Occurred()) {
                goto done;
            }
            if (op != NULL && op != Py_None) {
                if (!PyUnicode_CheckExact(op)) {
                    break;  /* a replace (a dict), or a value Python compares itself */
                }
                if (PyUnicode_Compare(op, s_append) == 0
                        && PyList_Append(appended, seq_obj) < 0) {
                    goto done;
                }
            }
        }
        else if ((found = PySet_Contains(stops, etype)) != 0) {
            if (found < 0) {
                goto done;
            }
            break;  /* a type the loop folds itself */
        }
        else if ((start = PyUnicode_Compare(etype, s_turn_start) == 0)
                 || PyUnicode_Compare(etype, s_turn_end) == 0) {
            if (start) {
                PyObject *data = PyDict_GetItemWithError(e, s_data);
                if (data == NULL) {
                    if (PyErr_Occurred()) {
                        goto done;
                    }
                    break;  /* Python's KeyError */
                }
                if (PyDict_Check(data)) {
                    if (!fold_event_type_ok(Py_TYPE(data))) {
                        break;  /* a dict of another class: its get() is Python's to call */
                    }
                    turn = PyDict_GetItemWithError(data, s_turn);
                    if (turn == NULL && PyErr_Occurred()) {
                        goto done;
                    }
                }
                last_turn = turn != NULL && PyLong_CheckExact(turn) ? turn : zero;
            }
            boundary = seq_obj;
            turn_open = start ? Py_True : Py_False;
        }
        count = seq + 1;
        last_time = etime;
        last_type = etype;
    }
    result = Py_BuildValue("(nLOOOOOO)", i, count, last_time, last_type, boundary, turn_open,
                           last_turn, appended);
done:
    Py_XDECREF(appended);
    Py_XDECREF(zero);
    return result;
}

/* ---- the append's event ---------------------------------------------------------------------
 * Session.append's per-event build in one call: the core shape check's accept path (the same
 * shape_ok and turn_shape_ok the restore admission uses) and the envelope, built in its key
 * order and out of the cyclic GC. Python judges whatever this does not vouch for. */

PyDoc_STRVAR(append_event_doc,
"append_event(event_type, type, seq, time, data, sources, op, ignorable, core, /)\n"
"-> Event | None\n\n"
"The event dsh.session._session.Session.append commits: {type, seq, time, data\n"
"[, sourceEventSeqs][, surfaceOp][, ignorable: true]} as an event_type instance, untracked\n"
"(sources and op omitted when None, ignorable only when true). With core true (type is one\n"
"of the core-shaped types) it is built only when _check_core_shape would accept data: a\n"
"message event whose shape message_shape_ok accepts, or a turn/step bracket in the forms\n"
"the restore admission accepts; otherwise None, and Python runs its check (which names the\n"
"problem) and builds the event itself. The values must already be frozen JSON.");

static PyObject *
append_event(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *etype, *data, *sources, *op, *event, *kv[14];
    PyTypeObject *event_type;
    Py_ssize_t pairs = 4;
    int core, ignorable, message, ok;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "append_event() takes exactly 9 arguments");
        return NULL;
    }
    if (!configured()) {
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], frozen_dict_type)) {
        PyErr_SetString(PyExc_TypeError, "append_event() needs a FrozenDict subclass");
        return NULL;
    }
    event_type = (PyTypeObject *)args[0];
    etype = args[1];
    data = args[4];
    sources = args[5];
    op = args[6];
    ignorable = PyObject_IsTrue(args[7]);
    core = PyObject_IsTrue(args[8]);
    if (ignorable < 0 || core < 0) {
        return NULL;
    }
    if (!PyUnicode_CheckExact(etype)) {
        Py_RETURN_NONE;
    }
    message = core && (str_is(etype, s_user_message) || str_is(etype, s_system_message)
                       || str_is(etype, s_assistant_message) || str_is(etype, s_tool_result));
    if (core && !message) {
        if (!(str_is(etype, s_turn_start) || str_is(etype, s_turn_end)
              || str_is(etype, s_step_start) || str_is(etype, s_step_end))
                || !turn_shape_ok(etype, data)) {
            Py_RETURN_NONE;  /* request/header, the legacy types, an unusual bracket */
        }
    }
    kv[0] = s_type; kv[1] = etype; kv[2] = s_seq; kv[3] = args[2];
    kv[4] = s_time; kv[5] = args[3]; kv[6] = s_data; kv[7] = data;
    {
        /* the optional fields, in the envelope's order; None (or ignorable false): absent */
        PyObject *const named[3][2] = {{s_source_event_seqs, sources}, {s_surface_op, op},
                                       {s_ignorable, ignorable ? Py_True : Py_None}};
        for (int k = 0; k < 3; k++) {
            if (named[k][1] != Py_None) {
                kv[2 * pairs] = named[k][0];
                kv[2 * pairs + 1] = named[k][1];
                pairs++;
            }
        }
    }
    event = frozen_of(event_type, kv, pairs);
    /* a message event: its shape read from the event itself (its own type and data) */
    ok = (event == NULL || !message) ? 1 : shape_ok(event);
    if (ok > 0) {
        return event;
    }
    Py_DECREF(event);
    return ok < 0 ? NULL : Py_NewRef(Py_None);
}

/* ---- end of the append's event ---------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"freeze_parsed", freeze_parsed, METH_O, freeze_parsed_doc},
    {"snapshot", snapshot, METH_O, snapshot_doc},
    {"untrack", untrack, METH_O, untrack_doc},
    {"snapshot_events", (PyCFunction)(void (*)(void))snapshot_events, METH_FASTCALL,
     snapshot_events_doc},
    {"scan_lines", (PyCFunction)(void (*)(void))scan_lines, METH_FASTCALL, scan_lines_doc},
    {"admit_plain", (PyCFunction)(void (*)(void))admit_plain, METH_FASTCALL, admit_plain_doc},
    {"decode_rows", (PyCFunction)(void (*)(void))decode_rows, METH_FASTCALL, decode_rows_doc},
    {"message_shape_ok", message_shape_ok, METH_O, message_shape_ok_doc},
    {"stored_prescan", (PyCFunction)(void (*)(void))stored_prescan, METH_FASTCALL,
     stored_prescan_doc},
    {"rows_text", (PyCFunction)(void (*)(void))rows_text, METH_FASTCALL, rows_text_doc},
    {"encode_rows", (PyCFunction)(void (*)(void))encode_rows, METH_FASTCALL, encode_rows_doc},
    {"seqs_contiguous", (PyCFunction)(void (*)(void))seqs_contiguous, METH_FASTCALL,
     seqs_contiguous_doc},
    {"gather_messages", (PyCFunction)(void (*)(void))gather_messages, METH_FASTCALL,
     gather_messages_doc},
    {"seqs_below", (PyCFunction)(void (*)(void))seqs_below, METH_FASTCALL, seqs_below_doc},
    {"running_sums_below", (PyCFunction)(void (*)(void))running_sums_below, METH_FASTCALL,
     running_sums_below_doc},
    {"widen_sums_below", (PyCFunction)(void (*)(void))widen_sums_below, METH_FASTCALL,
     widen_sums_below_doc},
    {"canonical", (PyCFunction)(void (*)(void))canonical, METH_FASTCALL, canonical_doc},
    {"chain_leaves", (PyCFunction)(void (*)(void))chain_leaves, METH_FASTCALL,
     chain_leaves_doc},
    {"chain_digest", (PyCFunction)(void (*)(void))chain_digest, METH_FASTCALL,
     chain_digest_doc},
    {"encode_sealed_rows", (PyCFunction)(void (*)(void))encode_sealed_rows, METH_FASTCALL,
     encode_sealed_rows_doc},
    {"plain_numbers", plain_numbers, METH_O, plain_numbers_doc},
    {"line_scan", line_scan, METH_O, line_scan_doc},
    {"record_texts", (PyCFunction)(void (*)(void))record_texts, METH_FASTCALL,
     record_texts_doc},
    {"pick_rows", (PyCFunction)(void (*)(void))pick_rows, METH_FASTCALL, pick_rows_doc},
    {"claude_line", (PyCFunction)(void (*)(void))claude_line, METH_FASTCALL,
     claude_line_doc},
    {"utc_millis", utc_millis, METH_O, utc_millis_doc},
    {"claude_envelope", claude_envelope, METH_O, claude_envelope_doc},
    {"claude_blocks", (PyCFunction)(void (*)(void))claude_blocks, METH_FASTCALL,
     claude_blocks_doc},
    {"claude_usage", claude_usage, METH_O, claude_usage_doc},
    {"claude_map", (PyCFunction)(void (*)(void))claude_map, METH_FASTCALL, claude_map_doc},
    {"decode_plain", (PyCFunction)(void (*)(void))decode_plain, METH_FASTCALL,
     decode_plain_doc},
    {"sqlite_bind", sqlite_bind, METH_O, sqlite_bind_doc},
    {"sqlite_open", sqlite_open, METH_O, sqlite_open_doc},
    {"read_rows", (PyCFunction)(void (*)(void))read_rows, METH_FASTCALL, read_rows_doc},
    {"crc32", (PyCFunction)(void (*)(void))crc32_twin, METH_FASTCALL, crc32_doc},
    {"seal_batch", (PyCFunction)(void (*)(void))seal_batch, METH_FASTCALL, seal_batch_doc},
    {"chain_hash", (PyCFunction)(void (*)(void))chain_hash, METH_FASTCALL, chain_hash_doc},
    {"fold_plain", (PyCFunction)(void (*)(void))fold_plain, METH_FASTCALL, fold_plain_doc},
    {"append_event", (PyCFunction)(void (*)(void))append_event, METH_FASTCALL,
     append_event_doc},
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
    if (intern_strings() < 0) {
        Py_DECREF(module);
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
    /* dsh.json uses the module only when this matches: bump it whenever a function's
     * arguments or results change, so a stale build (the build is optional) is not called */
    if (PyModule_AddIntConstant(module, "API_VERSION", 22) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    /* the SHA-256 of this file as setup.py read it: dsh.json compares it with the _speedups.c
     * beside the module (a source checkout), so a build older than its source is not used */
    if (PyModule_AddStringConstant(module, "SOURCE_SHA256", DSH_SOURCE_SHA256) < 0) {
        Py_DECREF(module);
        return NULL;
    }
#ifdef SHA_NI_BUILT
    /* DSH_SPEEDUPS_NO_SHA_NI=1: the hashlib path, for tests on a CPU that has the extensions */
    __builtin_cpu_init();
    use_sha_ni = __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1")
        && __builtin_cpu_supports("ssse3") && getenv("DSH_SPEEDUPS_NO_SHA_NI") == NULL;
#endif
#ifdef CLMUL_BUILT
    /* DSH_SPEEDUPS_NO_CLMUL=1: zlib's crc32, for tests on a CPU that has PCLMULQDQ */
    __builtin_cpu_init();
    crc_table_fill();
    use_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1")
        && getenv("DSH_SPEEDUPS_NO_CLMUL") == NULL;
#endif
    if (PyModule_AddIntConstant(module, "CLMUL", use_clmul) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "SHA_NI", use_sha_ni) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "FAST_DEPTH", FAST_DEPTH) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
