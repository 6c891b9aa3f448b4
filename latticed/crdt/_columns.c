/* latticed.crdt._columns: the column passes of the owner's bulk append, and the replica's rebuild of
   head bodies from log steps, in C (optional extension).

   Each function does in one pass over Python objects what the pure-Python path does with several
   (latticed/crdt/columns_compiled.py and leaf_compiled.py say which, and tests pin the results equal). None of them decides
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

/* versions(head_type, blake2b, persons, namespace, prev, log, raw, base, first, chain) -> list or None.

   The hot loop of latticed.crdt.leaf_bodies.decode_versions: the versions after prev that the log steps
   raw encode, each a head_type body (its leaf computed) or a (digest, end) leaf, folded into the log as
   they go. head_type: HeadV2 (its slots set as object.__setattr__ does). blake2b: the address of
   libsodium's crypto_generichash_blake2b_salt_personal; persons: the body's and the log's 16-byte
   personalisations. prev: (queue_id, epoch, version, start, end, base_hash, meta_version, meta_hash,
   timestamp) of the trusted body; log: its next log. The chain values known are those of offsets
   first .. first + len(chain): base, then chain's items. Anything this does not handle plainly (a
   malformed or truncated step, a counter out of range, an offset outside that window, a value of
   another type): None, and the Python path reads raw and says what is wrong. */
typedef int (*blake2b_fn)(unsigned char *out, size_t outlen, const unsigned char *in,
                          unsigned long long inlen, const unsigned char *key, size_t keylen,
                          const unsigned char *salt, const unsigned char *personal);

#define V_START 1
#define V_META 2
#define V_LEAF 4
#define V_MAX_OFFSET 0x7fffffffffffffffULL

static void v_put_u64(unsigned char *p, unsigned long long v)
{
    int i;
    for (i = 7; i >= 0; i--) {
        p[i] = (unsigned char) v;
        v >>= 8;
    }
}

/* A varint of at most 9 bytes (63 bits) at *at, or -1 (longer, or past the end). */
static int v_varint(const unsigned char *raw, Py_ssize_t size, Py_ssize_t *at, unsigned long long *out)
{
    unsigned long long value = 0;
    int shift;
    for (shift = 0; shift < 63; shift += 7) {
        unsigned char byte;
        if (*at >= size) {
            return -1;
        }
        byte = raw[(*at)++];
        value |= (unsigned long long) (byte & 0x7f) << shift;
        if (byte < 0x80) {
            *out = value;
            return 0;
        }
    }
    return -1;
}

/* The 32-byte chain value at offset, borrowed, or NULL if outside the window or not 32 bytes. */
static PyObject *v_chain_at(PyObject *base, unsigned long long first, PyObject *chain,
                            unsigned long long offset)
{
    PyObject *value;
    if (offset < first || offset - first > (unsigned long long) PyList_GET_SIZE(chain)) {
        return NULL;
    }
    value = offset == first ? base : PyList_GET_ITEM(chain, (Py_ssize_t) (offset - first - 1));
    return PyBytes_CheckExact(value) && PyBytes_GET_SIZE(value) == 32 ? value : NULL;
}

static PyObject *v_names[13];
static const char *v_name_strings[13] = {
    "queue_id", "epoch", "version", "log", "start", "end", "base_hash", "head_hash", "meta_version",
    "meta_hash", "timestamp", "signature", "_leaf",
};

static PyObject *versions(PyObject *self, PyObject *args)
{
    PyObject *head_type, *persons, *namespace, *prev, *log, *raw_obj, *base, *chain, *out = NULL;
    PyObject *queue_id, *epoch, *base_hash, *meta_hash, *empty = NULL;
    unsigned long long blake2b, first, version, start, end, meta_version, timestamp;
    const unsigned char *raw, *person_body, *person_log;
    unsigned char body[232], link[72], digest[32];
    Py_ssize_t at = 0, size, ns;
    blake2b_fn hash;
    PyTypeObject *type;
    int i;
    (void) self;
    if (!PyArg_ParseTuple(args, "OKO!O!O!O!O!OKO!", &head_type, &blake2b, &PyBytes_Type, &persons,
                          &PyBytes_Type, &namespace, &PyTuple_Type, &prev, &PyBytes_Type, &log,
                          &PyBytes_Type, &raw_obj, &base, &first, &PyList_Type, &chain)) {
        return NULL;
    }
    for (i = 0; i < 13; i++) {
        if (v_names[i] == NULL && (v_names[i] = PyUnicode_InternFromString(v_name_strings[i])) == NULL) {
            return NULL;
        }
    }
    if (!PyType_Check(head_type) || PyBytes_GET_SIZE(persons) != 32 || PyTuple_GET_SIZE(prev) != 9
        || PyBytes_GET_SIZE(log) != 32 || (ns = PyBytes_GET_SIZE(namespace)) != 24) {
        Py_RETURN_NONE;
    }
    type = (PyTypeObject *) head_type;
    hash = (blake2b_fn) (uintptr_t) blake2b;
    person_body = (const unsigned char *) PyBytes_AS_STRING(persons);
    person_log = person_body + 16;
    queue_id = PyTuple_GET_ITEM(prev, 0);
    epoch = PyTuple_GET_ITEM(prev, 1);
    base_hash = PyTuple_GET_ITEM(prev, 5);
    meta_hash = PyTuple_GET_ITEM(prev, 7);
    if (!PyBytes_CheckExact(queue_id) || PyBytes_GET_SIZE(queue_id) != 32 || !PyLong_CheckExact(epoch)
        || !PyBytes_CheckExact(base_hash) || PyBytes_GET_SIZE(base_hash) != 32
        || !PyBytes_CheckExact(meta_hash) || PyBytes_GET_SIZE(meta_hash) != 32) {
        Py_RETURN_NONE;
    }
    {
        unsigned long long e = PyLong_AsUnsignedLongLong(epoch);
        version = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(prev, 2));
        start = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(prev, 3));
        end = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(prev, 4));
        meta_version = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(prev, 6));
        timestamp = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(prev, 8));
        if (PyErr_Occurred()) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        memcpy(body, PyBytes_AS_STRING(namespace), 24);
        memcpy(body + 24, PyBytes_AS_STRING(queue_id), 32);
        v_put_u64(body + 56, e);
    }
    raw = (const unsigned char *) PyBytes_AS_STRING(raw_obj);
    size = PyBytes_GET_SIZE(raw_obj);
    out = PyList_New(0);
    empty = PyBytes_FromStringAndSize(NULL, 0);
    if (out == NULL || empty == NULL) {
        goto fail;
    }
    Py_INCREF(log);
    Py_INCREF(meta_hash);  /* owned from here on: prev's, then each new one's */
    while (at < size) {
        unsigned long long flags = raw[at++], step, value;
        PyObject *top, *item, *leaf, *digest_obj, *end_obj;
        if (v_varint(raw, size, &at, &step) < 0 || step > V_MAX_OFFSET - end || version == UINT64_MAX) {
            goto plain;
        }
        end += step;
        version += 1;
        if (flags & V_LEAF) {
            if (flags != V_LEAF || at + 32 > size) {
                goto plain;
            }
            memcpy(link + 32, raw + at, 32);
            at += 32;
            digest_obj = PyBytes_FromStringAndSize((const char *) link + 32, 32);
            end_obj = PyLong_FromUnsignedLongLong(end);
            if (digest_obj == NULL || end_obj == NULL) {
                Py_XDECREF(digest_obj);
                Py_XDECREF(end_obj);
                goto fail_log;
            }
            leaf = PyTuple_Pack(2, digest_obj, end_obj);
            Py_DECREF(digest_obj);
            Py_DECREF(end_obj);
            if (leaf == NULL || PyList_Append(out, leaf) < 0) {
                Py_XDECREF(leaf);
                goto fail_log;
            }
            Py_DECREF(leaf);
        } else {
            if (flags & ~(unsigned long long) (V_START | V_META) || v_varint(raw, size, &at, &value) < 0) {
                goto plain;
            }
            if (value & 1) {
                value = (value >> 1) + 1;
                if (value > timestamp) {
                    goto plain;
                }
                timestamp -= value;
            } else {
                value >>= 1;
                if (timestamp > UINT64_MAX - value) {
                    goto plain;
                }
                timestamp += value;
            }
            if (flags & V_START) {
                if (v_varint(raw, size, &at, &step) < 0 || step > end - start) {
                    goto plain;  /* past the end: the Python path says which */
                }
                start += step;
                base_hash = v_chain_at(base, first, chain, start);
                if (base_hash == NULL) {
                    goto plain;
                }
            }
            if (flags & V_META) {
                if (v_varint(raw, size, &at, &meta_version) < 0 || at + 32 > size) {
                    goto plain;
                }
                Py_DECREF(meta_hash);
                meta_hash = PyBytes_FromStringAndSize((const char *) raw + at, 32);
                if (meta_hash == NULL) {
                    Py_INCREF(empty);
                    meta_hash = empty;  /* released once below */
                    goto fail_log;
                }
                at += 32;
            }
            if (start > end || (top = v_chain_at(base, first, chain, end)) == NULL) {
                goto plain;
            }
            v_put_u64(body + 64, version);
            memcpy(body + 72, PyBytes_AS_STRING(log), 32);
            v_put_u64(body + 104, start);
            v_put_u64(body + 112, end);
            memcpy(body + 120, PyBytes_AS_STRING(base_hash), 32);
            memcpy(body + 152, PyBytes_AS_STRING(top), 32);
            v_put_u64(body + 184, meta_version);
            memcpy(body + 192, PyBytes_AS_STRING(meta_hash), 32);
            v_put_u64(body + 224, timestamp);
            if (hash(link + 32, 32, body, sizeof body, NULL, 0, NULL, person_body) != 0) {
                goto plain;
            }
            item = type->tp_alloc(type, 0);
            digest_obj = PyBytes_FromStringAndSize((const char *) link + 32, 32);
            end_obj = PyLong_FromUnsignedLongLong(end);
            leaf = digest_obj && end_obj ? PyTuple_Pack(2, digest_obj, end_obj) : NULL;
            Py_XDECREF(digest_obj);
            if (item == NULL || leaf == NULL) {
                Py_XDECREF(item);
                Py_XDECREF(leaf);
                Py_XDECREF(end_obj);
                goto fail_log;
            }
            {
                PyObject *values[13];
                int ok = 1, k;
                values[0] = queue_id;
                values[1] = epoch;
                values[2] = PyLong_FromUnsignedLongLong(version);
                values[3] = log;
                values[4] = PyLong_FromUnsignedLongLong(start);
                values[5] = end_obj;
                values[6] = base_hash;
                values[7] = top;
                values[8] = PyLong_FromUnsignedLongLong(meta_version);
                values[9] = meta_hash;
                values[10] = PyLong_FromUnsignedLongLong(timestamp);
                values[11] = empty;
                values[12] = leaf;
                for (k = 0; k < 13 && ok; k++) {
                    ok = values[k] != NULL && PyObject_GenericSetAttr(item, v_names[k], values[k]) == 0;
                }
                Py_XDECREF(values[2]);
                Py_XDECREF(values[4]);
                Py_XDECREF(values[8]);
                Py_XDECREF(values[10]);
                Py_DECREF(end_obj);
                Py_DECREF(leaf);
                if (!ok || PyList_Append(out, item) < 0) {
                    Py_DECREF(item);
                    goto fail_log;
                }
                Py_DECREF(item);
            }
        }
        /* log = H_log(log | digest | end) */
        memcpy(link, PyBytes_AS_STRING(log), 32);
        v_put_u64(digest, end);
        {
            unsigned char joined[72];
            PyObject *next;
            memcpy(joined, link, 64);
            memcpy(joined + 64, digest, 8);
            next = PyBytes_FromStringAndSize(NULL, 32);
            if (next == NULL) {
                goto fail_log;
            }
            if (hash((unsigned char *) PyBytes_AS_STRING(next), 32, joined, sizeof joined, NULL, 0, NULL,
                     person_log) != 0) {
                Py_DECREF(next);
                goto plain;
            }
            Py_DECREF(log);
            log = next;
        }
    }
    Py_DECREF(log);
    Py_DECREF(meta_hash);
    Py_DECREF(empty);
    return out;
plain:
    Py_DECREF(log);
    Py_DECREF(meta_hash);
    Py_DECREF(out);
    Py_DECREF(empty);
    Py_RETURN_NONE;
fail_log:
    Py_DECREF(log);
    Py_DECREF(meta_hash);
fail:
    Py_XDECREF(out);
    Py_XDECREF(empty);
    return NULL;
}

/* unpacked(values, value_lengths, keys, key_lengths, max_value, max_key) -> (values, keys, records) or
   None: an offer sent in the local API's packed layout (latticed/api/packed_offers.py) as columns.

   values: bytes, the values one after another; value_lengths: bytes, one little-endian int32 per record
   (0..max_value), summing to len(values), at least one record. keys: bytes, the keys one after another;
   key_lengths: bytes, one little-endian int32 per record (-1: no key, else 0..max_key), summing (over
   the present ones) to len(keys); or key_lengths None and keys empty: no record has a key. Returns the
   values and keys as tuples of new bytes (None for no key) and records: the bytes msgpack packs the
   records [value, key, []] into (an array of them, each item's shortest encoding). Anything else: None. */
static uint32_t le32(const unsigned char *p)
{
    return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static unsigned char *put_bin_header(unsigned char *p, Py_ssize_t len)
{
    if (len < 256) {
        *p++ = 0xC4;
        *p++ = (unsigned char) len;
    } else if (len < 65536) {
        *p++ = 0xC5;
        *p++ = (unsigned char) (len >> 8);
        *p++ = (unsigned char) len;
    } else {
        *p++ = 0xC6;
        *p++ = (unsigned char) (len >> 24);
        *p++ = (unsigned char) (len >> 16);
        *p++ = (unsigned char) (len >> 8);
        *p++ = (unsigned char) len;
    }
    return p;
}

static Py_ssize_t bin_size(Py_ssize_t len)
{
    return len + (len < 256 ? 2 : len < 65536 ? 3 : 5);
}

static PyObject *unpacked(PyObject *self, PyObject *args)
{
    PyObject *values, *value_lengths, *keys, *key_lengths, *vout = NULL, *kout = NULL, *records = NULL;
    Py_ssize_t max_value, max_key, n, i, vsum = 0, ksum = 0, size, vat = 0, kat = 0;
    const unsigned char *vl, *kl = NULL, *vdata, *kdata;
    unsigned char *p;
    (void) self;
    if (!PyArg_ParseTuple(args, "OOOOnn", &values, &value_lengths, &keys, &key_lengths, &max_value, &max_key)) {
        return NULL;
    }
    if (!PyBytes_CheckExact(values) || !PyBytes_CheckExact(value_lengths) || !PyBytes_CheckExact(keys)
        || !(key_lengths == Py_None || PyBytes_CheckExact(key_lengths))) {
        Py_RETURN_NONE;
    }
    n = PyBytes_GET_SIZE(value_lengths) / 4;
    if (n < 1 || PyBytes_GET_SIZE(value_lengths) != 4 * n) {
        Py_RETURN_NONE;
    }
    if (key_lengths == Py_None ? PyBytes_GET_SIZE(keys) != 0 : PyBytes_GET_SIZE(key_lengths) != 4 * n) {
        Py_RETURN_NONE;
    }
    vl = (const unsigned char *) PyBytes_AS_STRING(value_lengths);
    if (key_lengths != Py_None) {
        kl = (const unsigned char *) PyBytes_AS_STRING(key_lengths);
    }
    size = n < 16 ? 1 : n < 65536 ? 3 : 5;
    for (i = 0; i < n; i++) {
        int32_t v = (int32_t) le32(vl + 4 * i);
        if (v < 0 || v > max_value) {
            Py_RETURN_NONE;
        }
        vsum += v;
        size += 2 + bin_size(v); /* fixarray 3 and the empty headers, the value */
        if (kl == NULL) {
            size += 1;
            continue;
        }
        int32_t k = (int32_t) le32(kl + 4 * i);
        if (k < -1 || k > max_key) {
            Py_RETURN_NONE;
        }
        if (k == -1) {
            size += 1;
        } else {
            ksum += k;
            size += bin_size(k);
        }
    }
    if (vsum != PyBytes_GET_SIZE(values) || ksum != PyBytes_GET_SIZE(keys)) {
        Py_RETURN_NONE;
    }
    vdata = (const unsigned char *) PyBytes_AS_STRING(values);
    kdata = (const unsigned char *) PyBytes_AS_STRING(keys);
    vout = PyTuple_New(n);
    kout = PyTuple_New(n);
    records = PyBytes_FromStringAndSize(NULL, size);
    if (vout == NULL || kout == NULL || records == NULL) {
        goto fail;
    }
    p = (unsigned char *) PyBytes_AS_STRING(records);
    if (n < 16) {
        *p++ = (unsigned char) (0x90 | n);
    } else if (n < 65536) {
        *p++ = 0xDC;
        *p++ = (unsigned char) (n >> 8);
        *p++ = (unsigned char) n;
    } else {
        *p++ = 0xDD;
        *p++ = (unsigned char) (n >> 24);
        *p++ = (unsigned char) (n >> 16);
        *p++ = (unsigned char) (n >> 8);
        *p++ = (unsigned char) n;
    }
    for (i = 0; i < n; i++) {
        Py_ssize_t v = (Py_ssize_t) le32(vl + 4 * i);
        PyObject *value = PyBytes_FromStringAndSize((const char *) vdata + vat, v), *key;
        if (value == NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(vout, i, value);
        *p++ = 0x93;
        p = put_bin_header(p, v);
        memcpy(p, vdata + vat, (size_t) v);
        p += v;
        vat += v;
        if (kl == NULL || (int32_t) le32(kl + 4 * i) == -1) {
            Py_INCREF(Py_None);
            key = Py_None;
            *p++ = 0xC0;
        } else {
            Py_ssize_t k = (Py_ssize_t) le32(kl + 4 * i);
            key = PyBytes_FromStringAndSize((const char *) kdata + kat, k);
            if (key == NULL) {
                goto fail;
            }
            p = put_bin_header(p, k);
            memcpy(p, kdata + kat, (size_t) k);
            p += k;
            kat += k;
        }
        PyTuple_SET_ITEM(kout, i, key);
        *p++ = 0x90;
    }
    return Py_BuildValue("(NNN)", vout, kout, records);
fail:
    Py_XDECREF(vout);
    Py_XDECREF(kout);
    Py_XDECREF(records);
    return NULL;
}

static PyMethodDef methods[] = {
    {"offered", offered, METH_VARARGS, "An offer's records as value and key columns, and their packed size."},
    {"packed", packed, METH_VARARGS, "Value and key columns as the compiled chain hasher takes them."},
    {"pieces", pieces, METH_VARARGS, "Consecutive fixed-size pieces of a bytes-like object."},
    {"cuts", cuts, METH_VARARGS, "Where the owner ends signed slices of a run."},
    {"widest", widest, METH_VARARGS, "The longest value and the longest key of two columns."},
    {"same_int", same_int, METH_O, "Whether every item of a column is an int equal to the first."},
    {"unpacked", unpacked, METH_VARARGS, "An offer sent as packed columns: value and key columns, and its records packed."},
    {"versions", versions, METH_VARARGS, "The head bodies and leaves a log's steps encode."},
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
