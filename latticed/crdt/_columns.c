/* latticed.crdt._columns: the column passes of the owner's bulk append, in C (optional extension).

   Each function does in one pass over Python objects what the pure-Python path does with several
   (latticed/crdt/columns_compiled.py says which, and tests pin the results equal). None of them decides
   a verdict: where the input is not the plain shape they handle, they return None and the caller's
   Python path checks it and says what is wrong. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* offered(raw, max_records, max_value, max_key) -> (values, keys, packed_size) or None.

   raw: the decoded ``records`` of an offer. Accepted only when it is a list of 1..max_records items,
   each a list [value, key, headers]: value bytes of at most max_value, key bytes of at most max_key or
   None, headers an empty list or None. values/keys: tuples of those items (the same objects).
   packed_size: the bytes msgpack packs raw into (each item's shortest encoding). Anything else: None. */
static PyObject *offered(PyObject *self, PyObject *args)
{
    PyObject *raw, *values = NULL, *keys = NULL;
    Py_ssize_t max_records, max_value, max_key, n, i;
    unsigned long long size;
    (void) self;
    if (!PyArg_ParseTuple(args, "Onnn", &raw, &max_records, &max_value, &max_key)) {
        return NULL;
    }
    if (!PyList_CheckExact(raw)) {
        Py_RETURN_NONE;
    }
    n = PyList_GET_SIZE(raw);
    if (n < 1 || n > max_records) {
        Py_RETURN_NONE;
    }
    size = n < 16 ? 1 : n < 65536 ? 3 : 5;
    values = PyTuple_New(n);
    keys = PyTuple_New(n);
    if (values == NULL || keys == NULL) {
        goto fail;
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(raw, i), *value, *key, *headers;
        Py_ssize_t vlen, klen;
        if (!PyList_CheckExact(item) || PyList_GET_SIZE(item) != 3) {
            goto plain;
        }
        value = PyList_GET_ITEM(item, 0);
        key = PyList_GET_ITEM(item, 1);
        headers = PyList_GET_ITEM(item, 2);
        if (!PyBytes_CheckExact(value) || (vlen = PyBytes_GET_SIZE(value)) > max_value) {
            goto plain;
        }
        if (headers != Py_None && !(PyList_CheckExact(headers) && PyList_GET_SIZE(headers) == 0)) {
            goto plain;
        }
        /* fixarray 3, the value (bin 8/16/32), the key (the same, or nil), the headers (one byte) */
        size += 1 + (unsigned long long) vlen + (vlen < 256 ? 2 : vlen < 65536 ? 3 : 5) + 1;
        if (key == Py_None) {
            size += 1;
        } else if (PyBytes_CheckExact(key) && (klen = PyBytes_GET_SIZE(key)) <= max_key) {
            size += (unsigned long long) klen + (klen < 256 ? 2 : klen < 65536 ? 3 : 5);
        } else {
            goto plain;
        }
        Py_INCREF(value);
        PyTuple_SET_ITEM(values, i, value);
        Py_INCREF(key);
        PyTuple_SET_ITEM(keys, i, key);
    }
    return Py_BuildValue("(NNK)", values, keys, size);
plain:
    Py_DECREF(values);
    Py_DECREF(keys);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(values);
    Py_XDECREF(keys);
    return NULL;
}

/* packed(values, keys) -> (joined values, value lengths, joined keys, key lengths) or None.

   The columns as the compiled chain hasher takes them: the values' bytes one after another and their
   lengths (native uint32 each), the keys' the same (native int32 each, -1 for None). values: a tuple of
   bytes; keys: a tuple of bytes or None, as long. None if an item is of another type or a length does
   not fit. */
static PyObject *packed(PyObject *self, PyObject *args)
{
    PyObject *values, *keys, *joined = NULL, *vlens = NULL, *joined_keys = NULL, *klens = NULL;
    Py_ssize_t n, i, vtotal = 0, ktotal = 0;
    char *vp, *kp;
    uint32_t *vl;
    int32_t *kl;
    (void) self;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &values, &PyTuple_Type, &keys)) {
        return NULL;
    }
    n = PyTuple_GET_SIZE(values);
    if (PyTuple_GET_SIZE(keys) != n) {
        Py_RETURN_NONE;
    }
    for (i = 0; i < n; i++) {
        PyObject *value = PyTuple_GET_ITEM(values, i), *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) > (Py_ssize_t) UINT32_MAX) {
            Py_RETURN_NONE;
        }
        vtotal += PyBytes_GET_SIZE(value);
        if (key != Py_None) {
            if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) > (Py_ssize_t) INT32_MAX) {
                Py_RETURN_NONE;
            }
            ktotal += PyBytes_GET_SIZE(key);
        }
    }
    joined = PyBytes_FromStringAndSize(NULL, vtotal);
    vlens = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t) sizeof(uint32_t));
    joined_keys = PyBytes_FromStringAndSize(NULL, ktotal);
    klens = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t) sizeof(int32_t));
    if (joined == NULL || vlens == NULL || joined_keys == NULL || klens == NULL) {
        Py_XDECREF(joined);
        Py_XDECREF(vlens);
        Py_XDECREF(joined_keys);
        Py_XDECREF(klens);
        return NULL;
    }
    vp = PyBytes_AS_STRING(joined);
    kp = PyBytes_AS_STRING(joined_keys);
    vl = (uint32_t *) PyBytes_AS_STRING(vlens);
    kl = (int32_t *) PyBytes_AS_STRING(klens);
    for (i = 0; i < n; i++) {
        PyObject *value = PyTuple_GET_ITEM(values, i), *key = PyTuple_GET_ITEM(keys, i);
        Py_ssize_t vlen = PyBytes_GET_SIZE(value);
        memcpy(vp, PyBytes_AS_STRING(value), (size_t) vlen);
        vp += vlen;
        vl[i] = (uint32_t) vlen;
        if (key == Py_None) {
            kl[i] = -1;
        } else {
            Py_ssize_t klen = PyBytes_GET_SIZE(key);
            memcpy(kp, PyBytes_AS_STRING(key), (size_t) klen);
            kp += klen;
            kl[i] = (int32_t) klen;
        }
    }
    return Py_BuildValue("(NNNN)", joined, vlens, joined_keys, klens);
}

/* pieces(data, width) -> list of the len(data) / width consecutive pieces of data, as bytes. */
static PyObject *pieces(PyObject *self, PyObject *args)
{
    Py_buffer data;
    Py_ssize_t width, n, i;
    PyObject *out;
    (void) self;
    if (!PyArg_ParseTuple(args, "y*n", &data, &width)) {
        return NULL;
    }
    if (width <= 0 || data.len % width) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "the data is not a whole number of pieces");
        return NULL;
    }
    n = data.len / width;
    out = PyList_New(n);
    for (i = 0; out != NULL && i < n; i++) {
        PyObject *piece = PyBytes_FromStringAndSize((const char *) data.buf + i * width, width);
        if (piece == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, piece);
    }
    PyBuffer_Release(&data);
    return out;
}

/* cuts(values, keys, checkpoint_bytes) -> list of int, or None.

   Where the owner ends a signed slice of a run: after the record that brings the slice's payload
   (value and key bytes) to checkpoint_bytes or more, unless it is the run's last record. values: a
   tuple of bytes; keys: a tuple of bytes or None, as long; None if not. */
static PyObject *cuts(PyObject *self, PyObject *args)
{
    PyObject *values, *keys, *out;
    long long limit, size = 0;
    Py_ssize_t n, i;
    (void) self;
    if (!PyArg_ParseTuple(args, "O!O!L", &PyTuple_Type, &values, &PyTuple_Type, &keys, &limit)) {
        return NULL;
    }
    n = PyTuple_GET_SIZE(values);
    if (PyTuple_GET_SIZE(keys) != n) {
        Py_RETURN_NONE;
    }
    for (i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(values, i)) || (key != Py_None && !PyBytes_CheckExact(key))) {
            Py_RETURN_NONE;
        }
    }
    out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        size += PyBytes_GET_SIZE(PyTuple_GET_ITEM(values, i));
        if (key != Py_None) {
            size += PyBytes_GET_SIZE(key);
        }
        if (size >= limit && i < n - 1) {
            PyObject *cut = PyLong_FromSsize_t(i + 1);
            if (cut == NULL || PyList_Append(out, cut) < 0) {
                Py_XDECREF(cut);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(cut);
            size = 0;
        }
    }
    return out;
}

/* widest(values, keys) -> (longest value, longest key) or None.

   values: a list or tuple of bytes; keys: a list or tuple of bytes or None. The lengths of the longest
   value and of the longest key (0 when there are none, or every key is None); None if an item is of
   another type. */
static PyObject *widest(PyObject *self, PyObject *args)
{
    PyObject *values, *keys, *vfast = NULL, *kfast = NULL, *out = NULL;
    Py_ssize_t n, i, vmax = 0, kmax = 0;
    PyObject **vitems, **kitems;
    (void) self;
    if (!PyArg_ParseTuple(args, "OO", &values, &keys)) {
        return NULL;
    }
    if (!(PyList_CheckExact(values) || PyTuple_CheckExact(values))
        || !(PyList_CheckExact(keys) || PyTuple_CheckExact(keys))) {
        Py_RETURN_NONE;
    }
    vfast = PySequence_Fast(values, "");
    kfast = PySequence_Fast(keys, "");
    if (vfast == NULL || kfast == NULL) {
        goto done;
    }
    vitems = PySequence_Fast_ITEMS(vfast);
    kitems = PySequence_Fast_ITEMS(kfast);
    n = PySequence_Fast_GET_SIZE(vfast);
    for (i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(vitems[i])) {
            Py_INCREF(Py_None);
            out = Py_None;
            goto done;
        }
        if (PyBytes_GET_SIZE(vitems[i]) > vmax) {
            vmax = PyBytes_GET_SIZE(vitems[i]);
        }
    }
    n = PySequence_Fast_GET_SIZE(kfast);
    for (i = 0; i < n; i++) {
        if (kitems[i] == Py_None) {
            continue;
        }
        if (!PyBytes_CheckExact(kitems[i])) {
            Py_INCREF(Py_None);
            out = Py_None;
            goto done;
        }
        if (PyBytes_GET_SIZE(kitems[i]) > kmax) {
            kmax = PyBytes_GET_SIZE(kitems[i]);
        }
    }
    out = Py_BuildValue("(nn)", vmax, kmax);
done:
    Py_XDECREF(vfast);
    Py_XDECREF(kfast);
    return out;
}

/* same_int(column) -> bool: every item of a list or tuple is an int (exactly: not a bool) equal to the
   first; False for an empty column or anything else. */
static PyObject *same_int(PyObject *self, PyObject *column)
{
    PyObject *fast, *first;
    PyObject **items;
    Py_ssize_t n, i;
    int same = 1;
    (void) self;
    if (!(PyList_CheckExact(column) || PyTuple_CheckExact(column))) {
        Py_RETURN_FALSE;
    }
    fast = PySequence_Fast(column, "");
    if (fast == NULL) {
        return NULL;
    }
    n = PySequence_Fast_GET_SIZE(fast);
    items = PySequence_Fast_ITEMS(fast);
    first = n ? items[0] : NULL;
    if (first == NULL || !PyLong_CheckExact(first)) {
        same = 0;
    }
    for (i = 1; same && i < n; i++) {
        PyObject *item = items[i];
        if (item != first) {
            int equal;
            if (!PyLong_CheckExact(item)) {
                same = 0;
                break;
            }
            equal = PyObject_RichCompareBool(item, first, Py_EQ);
            if (equal < 0) {
                Py_DECREF(fast);
                return NULL;
            }
            same = equal;
        }
    }
    Py_DECREF(fast);
    return PyBool_FromLong(same);
}

static PyMethodDef methods[] = {
    {"offered", offered, METH_VARARGS, "An offer's records as value and key columns, and their packed size."},
    {"packed", packed, METH_VARARGS, "Value and key columns as the compiled chain hasher takes them."},
    {"pieces", pieces, METH_VARARGS, "Consecutive fixed-size pieces of a bytes-like object."},
    {"cuts", cuts, METH_VARARGS, "Where the owner ends signed slices of a run."},
    {"widest", widest, METH_VARARGS, "The longest value and the longest key of two columns."},
    {"same_int", same_int, METH_O, "Whether every item of a column is an int equal to the first."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columns", "The column passes of the owner's bulk append, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__columns(void)
{
    return PyModule_Create(&module);
}
