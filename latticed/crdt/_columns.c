/* latticed.crdt._columns: the column passes of the owner's bulk append, and a core-2 replica's passes
   per version of a catch-up (head bodies rebuilt from log steps, the log folded and its leaves checked,
   bodies checked against the log and the chain, bodies packed for the store), and a relay's check of a
   live push's head (appended_head) and a compact DELTA2's head read (compact_head), in C (optional
   extension).

   Each function does in one pass over Python objects what the pure-Python path does with several
   (latticed/crdt/columns_compiled.py and leaf_compiled.py say which, and tests pin the results equal). None of them decides
   a verdict: where the input is not the plain shape they handle, they return None and the caller's
   Python path checks it and says what is wrong. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
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
    if (PyList_GET_SIZE(raw) != n) { /* see compact_rows: a collection in PyTuple_New may run Python */
        goto plain;
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

/* versions(head_type, blake2b, persons, namespace, prev, log, raw, base, first, chain[, leaves, logs])
   -> list or None.

   The hot loop of latticed.crdt.leaf_bodies.decode_versions: the versions after prev that the log steps
   raw encode, each a head_type body (its leaf computed) or a (digest, end) leaf, folded into the log as
   they go. head_type: HeadV2 (its slots set as object.__setattr__ does). blake2b: the address of
   libsodium's crypto_generichash_blake2b_salt_personal; persons: the body's and the log's 16-byte
   personalisations. prev: (queue_id, epoch, version, start, end, base_hash, meta_version, meta_hash,
   timestamp) of the trusted body; log: its next log. The chain values known are those of offsets
   first .. first + len(chain): base, then chain's items. Anything this does not handle plainly (a
   malformed or truncated step, a counter out of range, an offset outside that window, a value of
   another type): None, and the Python path reads raw and says what is wrong. leaves, logs (empty
   lists, optional): filled with each version's leaf, and the log before each version then the last
   log, so the caller need not walk the bodies for them again (on None their contents mean nothing). */
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

/* Leave obj (if any, of a type the cycle collector tracks) out of the collector's lists: for objects
   that only ever hold atoms (bytes, ints, tuples of them), as CPython itself untracks such tuples. */
static void v_untrack(PyObject *obj)
{
    if (obj != NULL && PyObject_IS_GC(obj)) {
        PyObject_GC_UnTrack(obj);
    }
}

/* HeadV2's slots, in its fields' order (the signed body's, then the signature and the cached leaf):
   the passes below build and read heads slot by slot, so this table must be exactly HeadV2.__slots__
   (exported as HEAD_SLOTS, and tests/crdt/test_head2_slots_compiled.py pins it): a slot it lacks would
   be left empty in every head versions() or compact_head() builds from a peer's push. */
static PyObject *v_names[13];
static const char *v_name_strings[13] = {
    "queue_id", "epoch", "version", "log", "start", "end", "base_hash", "head_hash", "meta_version",
    "meta_hash", "timestamp", "signature", "_leaf",
};
/* The signed fields by slot: the 32-byte hashes and the unsigned 64-bit counters (HEAD_HASH_SLOTS,
   HEAD_COUNTER_SLOTS). */
static const int v_hashes[5] = {0, 3, 6, 7, 9};
static const int v_numbers[6] = {1, 2, 4, 5, 8, 10};

/* Where type keeps each of v_names' slots, if each is a plain writable object slot (0; else -1, and the
   slots are set through the attribute protocol). A new instance's slots are NULL: stored directly, as
   the slot's own setter would, without looking the name up once per field per version. */
static int v_offsets(PyTypeObject *type, Py_ssize_t offsets[13])
{
    int i;
    for (i = 0; i < 13; i++) {
        PyObject *descr = _PyType_Lookup(type, v_names[i]);
        PyMemberDef *member;
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) {
            return -1;
        }
        member = ((PyMemberDescrObject *) descr)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY) || member->offset <= 0) {
            return -1;
        }
        offsets[i] = member->offset;
    }
    return 0;
}

static PyObject *versions(PyObject *self, PyObject *args)
{
    PyObject *head_type, *persons, *namespace, *prev, *log, *raw_obj, *base, *chain, *out = NULL;
    PyObject *leaves_out = NULL, *logs_out = NULL;
    PyObject *queue_id, *epoch, *base_hash, *meta_hash, *empty = NULL, *top = NULL;
    PyObject *start_obj = NULL, *meta_version_obj = NULL; /* the last ones made: most versions repeat them */
    unsigned long long blake2b, first, version, start, end, meta_version, timestamp;
    unsigned long long start_made = 0, meta_version_made = 0;
    const unsigned char *raw, *person_body, *person_log;
    unsigned char body[232], link[72], digest[32];
    Py_ssize_t at = 0, size, ns, offsets[13], made = 0;
    blake2b_fn hash;
    PyTypeObject *type;
    int i, direct, compact;
    (void) self;
    if (!PyArg_ParseTuple(args, "OKO!O!O!O!O!OKO!|O!O!", &head_type, &blake2b, &PyBytes_Type, &persons,
                          &PyBytes_Type, &namespace, &PyTuple_Type, &prev, &PyBytes_Type, &log,
                          &PyBytes_Type, &raw_obj, &base, &first, &PyList_Type, &chain, &PyList_Type,
                          &leaves_out, &PyList_Type, &logs_out)) {
        return NULL;
    }
    if ((leaves_out != NULL && PyList_GET_SIZE(leaves_out) != 0)
        || (logs_out != NULL && PyList_GET_SIZE(logs_out) != 0)) {
        Py_RETURN_NONE;  /* filled from empty only: what is in them is this pass's */
    }
    for (i = 0; i < 13; i++) {
        if (v_names[i] == NULL && (v_names[i] = PyUnicode_InternFromString(v_name_strings[i])) == NULL) {
            return NULL;
        }
    }
    /* head_type None: the compact form. No body object is built: each version's timestamp goes into
       the bytes returned (native unsigned 64-bit, one a version) beside the leaves and logs, which it
       needs; steps that move the start or the metadata, or send a leaf, are left to the full form. */
    compact = head_type == Py_None;
    if ((!compact && !PyType_Check(head_type)) || (compact && (leaves_out == NULL || logs_out == NULL))
        || PyBytes_GET_SIZE(persons) != 32 || PyTuple_GET_SIZE(prev) != 9
        || PyBytes_GET_SIZE(log) != 32 || (ns = PyBytes_GET_SIZE(namespace)) != 24) {
        Py_RETURN_NONE;
    }
    type = compact ? NULL : (PyTypeObject *) head_type;
    direct = compact ? 0 : v_offsets(type, offsets) == 0;
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
    /* A version takes at least two bytes of steps: at most size / 2 timestamps. */
    out = compact ? PyBytes_FromStringAndSize(NULL, (size / 2 + 1) * 8) : PyList_New(0);
    empty = PyBytes_FromStringAndSize(NULL, 0);
    if (out == NULL || empty == NULL) {
        goto fail;
    }
    Py_INCREF(log);
    Py_INCREF(meta_hash);  /* owned from here on: prev's, then each new one's */
    /* Held, as top is, while it is in use: they may be chain's items, and the allocations below (a body,
       a leaf) may run a garbage collection, and with it any finalizer, which may empty chain. */
    Py_INCREF(base_hash);
    while (at < size) {
        unsigned long long flags = raw[at++], step, value;
        PyObject *item, *leaf, *digest_obj, *end_obj, *found;
        if (v_varint(raw, size, &at, &step) < 0 || step > V_MAX_OFFSET - end || version == UINT64_MAX) {
            goto plain;
        }
        end += step;
        version += 1;
        if (compact && flags != 0) {
            goto plain;
        }
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
            v_untrack(leaf);
            if (leaf == NULL || PyList_Append(out, leaf) < 0
                || (leaves_out != NULL && PyList_Append(leaves_out, leaf) < 0)) {
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
                if ((found = v_chain_at(base, first, chain, start)) == NULL) {
                    goto plain;
                }
                Py_INCREF(found);
                Py_SETREF(base_hash, found);
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
            Py_INCREF(top);
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
            if (compact) {
                memcpy(PyBytes_AS_STRING(out) + 8 * made, &timestamp, 8);
                made += 1;
                digest_obj = PyBytes_FromStringAndSize((const char *) link + 32, 32);
                end_obj = PyLong_FromUnsignedLongLong(end);
                leaf = digest_obj && end_obj ? PyTuple_Pack(2, digest_obj, end_obj) : NULL;
                Py_XDECREF(digest_obj);
                Py_XDECREF(end_obj);
                if (leaf == NULL) {
                    goto fail_log;
                }
                v_untrack(leaf);
                if (PyList_Append(leaves_out, leaf) < 0) {
                    Py_DECREF(leaf);
                    goto fail_log;
                }
                Py_DECREF(leaf);
                goto folded;
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
                if (start_obj == NULL || start_made != start) {
                    Py_XDECREF(start_obj);
                    start_obj = PyLong_FromUnsignedLongLong(start);
                    start_made = start;
                }
                if (meta_version_obj == NULL || meta_version_made != meta_version) {
                    Py_XDECREF(meta_version_obj);
                    meta_version_obj = PyLong_FromUnsignedLongLong(meta_version);
                    meta_version_made = meta_version;
                }
                values[4] = start_obj; /* borrowed, as the others not made here */
                values[5] = end_obj;
                values[6] = base_hash;
                values[7] = top;
                values[8] = meta_version_obj;
                values[9] = meta_hash;
                values[10] = PyLong_FromUnsignedLongLong(timestamp);
                values[11] = empty;
                values[12] = leaf;
                for (k = 0; k < 13 && ok; k++) {
                    ok = values[k] != NULL;
                    if (ok && direct) {
                        Py_INCREF(values[k]);
                        *(PyObject **) ((char *) item + offsets[k]) = values[k];
                    } else if (ok) {
                        ok = PyObject_GenericSetAttr(item, v_names[k], values[k]) == 0;
                    }
                }
                if (ok && direct) {
                    /* Every slot holds bytes, an int or the leaf (a bytes and an int): neither can be
                       in a reference cycle, so the cycle collector need not traverse them (a catch-up
                       makes two such objects a version; traversing them was ~0.1 us each). */
                    v_untrack(item);
                    v_untrack(leaf);
                }
                Py_XDECREF(values[2]);
                Py_XDECREF(values[10]);
                Py_DECREF(end_obj);
                if (!ok || PyList_Append(out, item) < 0
                    || (leaves_out != NULL && PyList_Append(leaves_out, leaf) < 0)) {
                    Py_DECREF(leaf);
                    Py_DECREF(item);
                    goto fail_log;
                }
                Py_DECREF(leaf);
                Py_DECREF(item);
            }
        }
    folded:
        Py_CLEAR(top);
        /* log = H_log(log | digest | end) */
        if (logs_out != NULL && PyList_Append(logs_out, log) < 0) {
            goto fail_log;
        }
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
    if (logs_out != NULL && PyList_Append(logs_out, log) < 0) {
        goto fail_log;
    }
    if (compact && _PyBytes_Resize(&out, 8 * made) < 0) {
        goto fail_log;
    }
    Py_DECREF(log);
    Py_DECREF(meta_hash);
    Py_DECREF(base_hash);
    Py_DECREF(empty);
    Py_XDECREF(start_obj);
    Py_XDECREF(meta_version_obj);
    return out;
plain:
    Py_DECREF(log);
    Py_DECREF(meta_hash);
    Py_DECREF(base_hash);
    Py_XDECREF(top);
    Py_DECREF(out);
    Py_DECREF(empty);
    Py_XDECREF(start_obj);
    Py_XDECREF(meta_version_obj);
    Py_RETURN_NONE;
fail_log:
    Py_DECREF(log);
    Py_DECREF(meta_hash);
    Py_DECREF(base_hash);
    Py_XDECREF(top);
fail:
    Py_XDECREF(out);
    Py_XDECREF(empty);
    Py_XDECREF(start_obj);
    Py_XDECREF(meta_version_obj);
    return NULL;
}

/* Whether item is a leaf as head2.is_leaf says: an exact tuple of an exact 32-byte bytes and an exact
   int (no subclass of any: this reads their storage, which a subclass's len or iteration, what Python
   reads, may contradict; bool is an int subclass) from 0 to 2^63-1; its digest and end through the
   pointers. */
static int f_leaf(PyObject *item, const char **digest, unsigned long long *end)
{
    PyObject *d, *e;
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) {
        return 0;
    }
    d = PyTuple_GET_ITEM(item, 0);
    e = PyTuple_GET_ITEM(item, 1);
    if (!PyBytes_CheckExact(d) || PyBytes_GET_SIZE(d) != 32 || !PyLong_CheckExact(e)) {
        return 0;
    }
    *end = PyLong_AsUnsignedLongLong(e);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *digest = PyBytes_AS_STRING(d);
    return *end <= V_MAX_OFFSET;
}

/* are_leaves(items): whether every item of a list or tuple is a leaf (head2.is_leaf). */
static PyObject *are_leaves(PyObject *self, PyObject *items)
{
    Py_ssize_t i, n;
    PyObject **all;
    const char *digest;
    unsigned long long end;
    (void) self;
    if (!PyList_CheckExact(items) && !PyTuple_CheckExact(items)) {
        Py_RETURN_NONE;
    }
    n = PySequence_Fast_GET_SIZE(items);
    all = PySequence_Fast_ITEMS(items);
    for (i = 0; i < n; i++) {
        if (!f_leaf(all[i], &digest, &end)) {
            Py_RETURN_FALSE;
        }
    }
    Py_RETURN_TRUE;
}

/* fold(blake2b, person, log, leaves, stride): head2.fold(log, leaves), and the log after each stride-th
   leaf (none if stride is 0), as (log, [logs]); None if leaves is not a list or tuple of leaves
   (are_leaves) or the arguments are not the sizes the fold takes: the Python path then folds. */
static PyObject *fold(PyObject *self, PyObject *args)
{
    PyObject *person, *log, *leaves, *folds, *last, *result;
    unsigned long long blake2b, end;
    Py_ssize_t stride, i, n;
    PyObject **all;
    unsigned char joined[72], next[32];
    const char *digest;
    blake2b_fn hash;
    (void) self;
    if (!PyArg_ParseTuple(args, "KO!O!On", &blake2b, &PyBytes_Type, &person, &PyBytes_Type, &log, &leaves,
                          &stride)) {
        return NULL;
    }
    if (PyBytes_GET_SIZE(person) != 16 || PyBytes_GET_SIZE(log) != 32 || stride < 0
        || (!PyList_CheckExact(leaves) && !PyTuple_CheckExact(leaves))) {
        Py_RETURN_NONE;
    }
    hash = (blake2b_fn) (uintptr_t) blake2b;
    /* Made before leaves is read: PyList_New may run a garbage collection, and with it any finalizer,
       which may change leaves. Nothing in the loop below collects (bytes and a list's growth do not);
       the closing PyTuple_Pack may, but leaves is not read after it. */
    folds = PyList_New(0);
    if (folds == NULL) {
        return NULL;
    }
    n = PySequence_Fast_GET_SIZE(leaves);
    all = PySequence_Fast_ITEMS(leaves);
    for (i = 0; i < n; i++) {  /* all checked first: none folded unless all are leaves */
        if (!f_leaf(all[i], &digest, &end)) {
            Py_DECREF(folds);
            Py_RETURN_NONE;
        }
    }
    memcpy(joined, PyBytes_AS_STRING(log), 32);
    for (i = 0; i < n; i++) {
        if (!f_leaf(all[i], &digest, &end)) {
            Py_DECREF(folds);
            Py_RETURN_NONE;
        }
        memcpy(joined + 32, digest, 32);
        v_put_u64(joined + 64, end);
        if (hash(next, 32, joined, sizeof joined, NULL, 0, NULL,
                 (const unsigned char *) PyBytes_AS_STRING(person)) != 0) {
            Py_DECREF(folds);
            Py_RETURN_NONE;
        }
        memcpy(joined, next, 32);
        if (stride && (i + 1) % stride == 0) {
            PyObject *step = PyBytes_FromStringAndSize((const char *) joined, 32);
            if (step == NULL || PyList_Append(folds, step) < 0) {
                Py_XDECREF(step);
                Py_DECREF(folds);
                return NULL;
            }
            Py_DECREF(step);
        }
    }
    last = PyBytes_FromStringAndSize((const char *) joined, 32);
    if (last == NULL) {
        Py_DECREF(folds);
        return NULL;
    }
    result = PyTuple_Pack(2, last, folds);
    Py_DECREF(last);
    Py_DECREF(folds);
    return result;
}

/* chain_run(blake2b, record_person, chain_person, base, first, values, keys, timestamps, tail) -> the
   chain values after each record (a list of 32-byte bytes), or None.

   records.chain_extend of a few records held as columns (a RecordRun without headers: a relay's live
   push, a single offer), hashed straight from the columns, not through a Record and encode_record:
   record i's canonical bytes are offset u64 | timestamp i64 | has_key u8 | key length u32 | value length
   u32 | key | value | tail (encode_record's layout; tail: the encoded headers, b"\x00\x00" for none), its
   digest H(bytes, record_person), the chain value H(previous | digest, chain_person), from base. Taken
   only when blake2b is an address, the persons 16 bytes, base 32 bytes, first an exact int with
   first + n - 1 below 2^64, values, keys and timestamps exact tuples of n (1..CR_MAX) items, each value
   exact bytes and each key exact bytes or None, both shorter than 2^32, each timestamp an exact int
   within int64, tail exact bytes: anything else answers None, and records._chain_small hashes (and
   raises what it raises). Every value is read and hashed before a Python object is made (no collection,
   so no finalizer, runs while the borrowed items are read; the tuples and bytes cannot change anyway). */
#define CR_MAX 64
#define CR_FIXED 25
#define CR_SMALL 2048

static void cr_put_u32(unsigned char *p, unsigned long long v)
{
    p[0] = (unsigned char) (v >> 24);
    p[1] = (unsigned char) (v >> 16);
    p[2] = (unsigned char) (v >> 8);
    p[3] = (unsigned char) v;
}

static PyObject *chain_run(PyObject *self, PyObject *args)
{
    PyObject *record_person, *chain_person, *base, *first_obj, *values, *keys, *timestamps, *tail, *out;
    unsigned long long blake2b, first;
    long long stamps[CR_MAX];
    unsigned char chains[CR_MAX * 32], link[64], small[CR_SMALL], *scratch = small;
    const unsigned char *previous;
    size_t biggest = 0, tlen;
    Py_ssize_t n, i;
    blake2b_fn hash;
    int failed = 0;
    (void) self;
    if (!PyArg_ParseTuple(args, "KOOOOOOOO", &blake2b, &record_person, &chain_person, &base, &first_obj,
                          &values, &keys, &timestamps, &tail)) {
        return NULL;
    }
    if (blake2b == 0 || !PyBytes_CheckExact(record_person) || PyBytes_GET_SIZE(record_person) != 16
        || !PyBytes_CheckExact(chain_person) || PyBytes_GET_SIZE(chain_person) != 16
        || !PyBytes_CheckExact(base) || PyBytes_GET_SIZE(base) != 32 || !PyBytes_CheckExact(tail)
        || !PyLong_CheckExact(first_obj) || !PyTuple_CheckExact(values) || !PyTuple_CheckExact(keys)
        || !PyTuple_CheckExact(timestamps)) {
        Py_RETURN_NONE;
    }
    n = PyTuple_GET_SIZE(values);
    if (n < 1 || n > CR_MAX || PyTuple_GET_SIZE(keys) != n || PyTuple_GET_SIZE(timestamps) != n) {
        Py_RETURN_NONE;
    }
    first = PyLong_AsUnsignedLongLong(first_obj);
    if (first == (unsigned long long) -1 && PyErr_Occurred()) {  /* negative, or past 64 bits */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (first > ~0ULL - (unsigned long long) (n - 1)) {
        Py_RETURN_NONE;
    }
    tlen = (size_t) PyBytes_GET_SIZE(tail);
    for (i = 0; i < n; i++) {  /* every column checked, and the biggest record's size, before hashing */
        PyObject *value = PyTuple_GET_ITEM(values, i), *key = PyTuple_GET_ITEM(keys, i);
        PyObject *stamp = PyTuple_GET_ITEM(timestamps, i);
        size_t klen = 0, vlen, size;
        int overflow = 0;
        if (!PyBytes_CheckExact(value) || (key != Py_None && !PyBytes_CheckExact(key))
            || !PyLong_CheckExact(stamp)) {
            Py_RETURN_NONE;
        }
        vlen = (size_t) PyBytes_GET_SIZE(value);
        if (key != Py_None) {
            klen = (size_t) PyBytes_GET_SIZE(key);
        }
        stamps[i] = PyLong_AsLongLongAndOverflow(stamp, &overflow);
        if (overflow || vlen > 0xffffffffULL || klen > 0xffffffffULL) {
            Py_RETURN_NONE;
        }
        size = CR_FIXED + klen + vlen + tlen;
        biggest = size > biggest ? size : biggest;
    }
    if (biggest > sizeof small && (scratch = PyMem_Malloc(biggest)) == NULL) {
        return PyErr_NoMemory();
    }
    hash = (blake2b_fn) (uintptr_t) blake2b;
    previous = (const unsigned char *) PyBytes_AS_STRING(base);
    for (i = 0; i < n && !failed; i++) {
        PyObject *value = PyTuple_GET_ITEM(values, i), *key = PyTuple_GET_ITEM(keys, i);
        size_t klen = key == Py_None ? 0 : (size_t) PyBytes_GET_SIZE(key);
        size_t vlen = (size_t) PyBytes_GET_SIZE(value);
        unsigned char *p = scratch;
        v_put_u64(p, first + (unsigned long long) i);
        v_put_u64(p + 8, (unsigned long long) stamps[i]);
        p[16] = key != Py_None;
        cr_put_u32(p + 17, klen);
        cr_put_u32(p + 21, vlen);
        p += CR_FIXED;
        if (klen) {
            memcpy(p, PyBytes_AS_STRING(key), klen);
            p += klen;
        }
        memcpy(p, PyBytes_AS_STRING(value), vlen);
        p += vlen;
        memcpy(p, PyBytes_AS_STRING(tail), tlen);
        p += tlen;
        memcpy(link, previous, 32);
        failed = hash(link + 32, 32, scratch, (unsigned long long) (p - scratch), NULL, 0, NULL,
                      (const unsigned char *) PyBytes_AS_STRING(record_person))
                 || hash(chains + 32 * i, 32, link, sizeof link, NULL, 0, NULL,
                         (const unsigned char *) PyBytes_AS_STRING(chain_person));
        previous = chains + 32 * i;
    }
    if (scratch != small) {
        PyMem_Free(scratch);
    }
    if (failed) {  /* libsodium refused: the Python path hashes */
        Py_RETURN_NONE;
    }
    if ((out = PyList_New(n)) == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *value = PyBytes_FromStringAndSize((const char *) chains + 32 * i, 32);
        if (value == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, value);
    }
    return out;
}
/* The interned names of the slots versions() sets and packed_bodies() reads (0: made, -1: failed). */
static int v_names_ready(void)
{
    int i;
    for (i = 0; i < 13; i++) {
        if (v_names[i] == NULL && (v_names[i] = PyUnicode_InternFromString(v_name_strings[i])) == NULL) {
            return -1;
        }
    }
    return 0;
}

/* packed_bodies(head_type, namespace, heads): each head's to_bytes() (namespace, the signed fields
   big-endian, its signature), or None if an item is not exactly of head_type or a field does not fit the
   layout (the Python path then packs, and raises what it raises). */
static PyObject *packed_bodies(PyObject *self, PyObject *args)
{
    static const int hash_at[5] = {24, 72, 120, 152, 192};
    static const int number_at[6] = {56, 64, 104, 112, 184, 224};
    PyObject *head_type, *namespace, *heads, *out, *head;
    Py_ssize_t i, n;
    (void) self;
    if (!PyArg_ParseTuple(args, "OO!O", &head_type, &PyBytes_Type, &namespace, &heads)) {
        return NULL;
    }
    if (!PyType_Check(head_type) || PyBytes_GET_SIZE(namespace) != 24
        || (!PyList_CheckExact(heads) && !PyTuple_CheckExact(heads)) || v_names_ready() < 0) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    n = PySequence_Fast_GET_SIZE(heads);
    out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *field, *signature, *packed;
        unsigned char *p;
        int k, fits = 1;
        /* PyList_New may run a garbage collection, and with it any finalizer, which may shrink heads (as
           may a getattr that runs Python): its size is read again before each item, and the item held
           while its fields are read. */
        if (PySequence_Fast_GET_SIZE(heads) != n) {
            goto plain;
        }
        head = PySequence_Fast_GET_ITEM(heads, i);
        if (Py_TYPE(head) != (PyTypeObject *) head_type) {
            goto plain;
        }
        Py_INCREF(head);
        signature = PyObject_GetAttr(head, v_names[11]);
        if (signature == NULL) {
            goto fail_head;
        }
        if (!PyBytes_CheckExact(signature)) {
            Py_DECREF(signature);
            goto plain_head;
        }
        packed = PyBytes_FromStringAndSize(NULL, 232 + PyBytes_GET_SIZE(signature));
        if (packed == NULL) {
            Py_DECREF(signature);
            goto fail_head;
        }
        p = (unsigned char *) PyBytes_AS_STRING(packed);
        memcpy(p, PyBytes_AS_STRING(namespace), 24);
        memcpy(p + 232, PyBytes_AS_STRING(signature), PyBytes_GET_SIZE(signature));
        Py_DECREF(signature);
        PyList_SET_ITEM(out, i, packed);  /* owned by out from here on */
        for (k = 0; k < 5 && fits; k++) {
            if ((field = PyObject_GetAttr(head, v_names[v_hashes[k]])) == NULL) {
                goto fail_head;
            }
            fits = PyBytes_CheckExact(field) && PyBytes_GET_SIZE(field) == 32;
            if (fits) {
                memcpy(p + hash_at[k], PyBytes_AS_STRING(field), 32);
            }
            Py_DECREF(field);
        }
        for (k = 0; k < 6 && fits; k++) {
            unsigned long long value;
            if ((field = PyObject_GetAttr(head, v_names[v_numbers[k]])) == NULL) {
                goto fail_head;
            }
            fits = PyLong_CheckExact(field);
            value = fits ? PyLong_AsUnsignedLongLong(field) : 0;
            Py_DECREF(field);
            if (fits && PyErr_Occurred()) {
                PyErr_Clear();
                fits = 0;
            }
            v_put_u64(p + number_at[k], value);
        }
        Py_DECREF(head);
        if (!fits) {
            goto plain;
        }
    }
    if (PySequence_Fast_GET_SIZE(heads) != n) {  /* grown by a getattr: not the heads asked of */
        goto plain;
    }
    return out;
plain_head:
    Py_DECREF(head);
plain:
    Py_DECREF(out);
    Py_RETURN_NONE;
fail_head:
    Py_DECREF(head);
    Py_DECREF(out);
    return NULL;
}

/* unvouched(head_type, bodies, shared, queue_id, epoch, chain, first): the indices of the bodies this
   pass does not confirm, or None (arguments not of the plain shape). A body is confirmed when it is
   exactly of head_type, of queue_id and epoch, its leaf (already computed) is shared[version - 1], and its
   head_hash is the chain value at its end (chain holds offsets first + 1 ...). Anything else (a leaf not
   computed yet, a version on a tip, a mismatch) is left to the caller's Python check, which decides. */
/* a == b for unvouched: bytes compared in place (the usual case), anything else as Python compares it
   (1, 0, or -1 with an exception set). */
static int u_same(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
    if (PyBytes_CheckExact(a) && PyBytes_CheckExact(b)) {
        return PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b)
               && memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), (size_t) PyBytes_GET_SIZE(a)) == 0;
    }
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* Two leaves equal, as tuples compare: a pair of exact tuples item by item (u_same), else Python's ==. */
static int u_same_leaf(PyObject *a, PyObject *b)
{
    int same;
    if (a == b) {
        return 1;
    }
    if (!PyTuple_CheckExact(a) || !PyTuple_CheckExact(b) || PyTuple_GET_SIZE(a) != 2 || PyTuple_GET_SIZE(b) != 2) {
        return PyObject_RichCompareBool(a, b, Py_EQ);
    }
    same = u_same(PyTuple_GET_ITEM(a, 0), PyTuple_GET_ITEM(b, 0));
    return same == 1 ? u_same(PyTuple_GET_ITEM(a, 1), PyTuple_GET_ITEM(b, 1)) : same;
}

static PyObject *unvouched(PyObject *self, PyObject *args)
{
    PyObject *head_type, *bodies, *shared, *queue_id, *epoch, *chain, *out;
    unsigned long long first;
    Py_ssize_t i, n, held, length, offsets[13];
    int direct;
    (void) self;
    if (!PyArg_ParseTuple(args, "OOO!O!OO!K", &head_type, &bodies, &PyTuple_Type, &shared, &PyBytes_Type,
                          &queue_id, &epoch, &PyList_Type, &chain, &first)) {
        return NULL;
    }
    if (!PyType_Check(head_type) || !PyLong_CheckExact(epoch)
        || (!PyList_CheckExact(bodies) && !PyTuple_CheckExact(bodies)) || v_names_ready() < 0) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    /* Where the slots are plain object slots, each is read in place (as its descriptor would read it),
       not looked up by name six times a body; an empty slot is read through getattr, which raises. */
    direct = v_offsets((PyTypeObject *) head_type, offsets) == 0;
    held = PyTuple_GET_SIZE(shared);
    out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    /* PyList_New may run a garbage collection, and with it any finalizer, as may a getattr or a
       comparison run Python: bodies' and chain's sizes are read after it, and again at each body (a
       change hands the whole call to the Python check). */
    n = PySequence_Fast_GET_SIZE(bodies);
    length = PyList_GET_SIZE(chain);
    for (i = 0; i < n; i++) {
        PyObject *body, *values[6] = {NULL};
        int confirmed = 0, k, failed = 0;
        static const int slots[6] = {0, 1, 2, 5, 7, 12}; /* queue_id, epoch, version, end, head_hash, _leaf */
        if (PySequence_Fast_GET_SIZE(bodies) != n || PyList_GET_SIZE(chain) != length) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        body = PySequence_Fast_GET_ITEM(bodies, i);
        if (Py_TYPE(body) == (PyTypeObject *) head_type) {
            Py_INCREF(body); /* held while its slots are read, whatever a getattr runs */
            for (k = 0; k < 6 && !failed; k++) {
                PyObject *slot = direct ? *(PyObject **) ((char *) body + offsets[slots[k]]) : NULL;
                if (slot != NULL) {
                    Py_INCREF(slot);
                    values[k] = slot;
                } else {
                    values[k] = PyObject_GetAttr(body, v_names[slots[k]]);
                }
                failed = values[k] == NULL;
            }
            Py_DECREF(body);
            if (failed) {
                for (k = 0; k < 6; k++) {
                    Py_XDECREF(values[k]);
                }
                Py_DECREF(out);
                return NULL;
            }
            if (PyBytes_CheckExact(values[0]) && PyLong_CheckExact(values[1]) && PyLong_CheckExact(values[2])
                && PyLong_CheckExact(values[3]) && PyBytes_CheckExact(values[4]) && PyTuple_CheckExact(values[5])) {
                long long version = PyLong_AsLongLong(values[2]);
                unsigned long long end = PyLong_AsUnsignedLongLong(values[3]);
                if (PyErr_Occurred()) {
                    PyErr_Clear();
                } else if (version >= 1 && version <= held && end > first
                           && end - first <= (unsigned long long) PyList_GET_SIZE(chain)) {
                    PyObject *top = PyList_GET_ITEM(chain, (Py_ssize_t) (end - first - 1));
                    int same;
                    Py_INCREF(top); /* held across the comparisons, whatever they run */
                    same = u_same(values[0], queue_id);
                    if (same == 1) {
                        same = u_same(values[1], epoch);
                    }
                    if (same == 1) {
                        same = u_same_leaf(PyTuple_GET_ITEM(shared, version - 1), values[5]);
                    }
                    if (same == 1) {
                        same = u_same(values[4], top);
                    }
                    Py_DECREF(top);
                    if (same < 0) {
                        failed = 1;
                    }
                    confirmed = same == 1;
                }
            }
            for (k = 0; k < 6; k++) {
                Py_DECREF(values[k]);
            }
            if (failed) {
                Py_DECREF(out);
                return NULL;
            }
        }
        if (!confirmed) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(out, index) < 0) {
                Py_XDECREF(index);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(index);
        }
    }
    if (PySequence_Fast_GET_SIZE(bodies) != n || PyList_GET_SIZE(chain) != length) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
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

/* segment_data(keys, values, tail) -> bytes, or None.

   A segment's stored ``data`` (latticed/storage/segments.py): msgpack of [keys, values, timestamps,
   headers] where tail is the last two columns already packed. keys: a list or tuple of bytes or None;
   values: a list or tuple of bytes, as long. Written into one buffer: no packed column and no join of
   them. Anything else (another type, another length): None. */
static Py_ssize_t array_head(unsigned char *p, Py_ssize_t n)
{
    if (n < 16) {
        if (p) p[0] = (unsigned char) (0x90 | n);
        return 1;
    }
    if (n < 65536) {
        if (p) { p[0] = 0xdc; p[1] = (unsigned char) (n >> 8); p[2] = (unsigned char) n; }
        return 3;
    }
    if (p) {
        p[0] = 0xdd; p[1] = (unsigned char) (n >> 24); p[2] = (unsigned char) (n >> 16);
        p[3] = (unsigned char) (n >> 8); p[4] = (unsigned char) n;
    }
    return 5;
}

static Py_ssize_t bin_head(unsigned char *p, Py_ssize_t n)
{
    if (n < 256) {
        if (p) { p[0] = 0xc4; p[1] = (unsigned char) n; }
        return 2;
    }
    if (n < 65536) {
        if (p) { p[0] = 0xc5; p[1] = (unsigned char) (n >> 8); p[2] = (unsigned char) n; }
        return 3;
    }
    if (p) {
        p[0] = 0xc6; p[1] = (unsigned char) (n >> 24); p[2] = (unsigned char) (n >> 16);
        p[3] = (unsigned char) (n >> 8); p[4] = (unsigned char) n;
    }
    return 5;
}

static PyObject *segment_data(PyObject *self, PyObject *args)
{
    PyObject *keys, *values, *out;
    Py_buffer tail;
    PyObject **ks, **vs;
    Py_ssize_t n, i, size;
    unsigned char *p;
    (void) self;
    if (!PyArg_ParseTuple(args, "OOy*", &keys, &values, &tail)) {
        return NULL;
    }
    if (!(PyList_CheckExact(keys) || PyTuple_CheckExact(keys))
        || !(PyList_CheckExact(values) || PyTuple_CheckExact(values))
        || PySequence_Fast_GET_SIZE(keys) != PySequence_Fast_GET_SIZE(values)) {
        PyBuffer_Release(&tail);
        Py_RETURN_NONE;
    }
    n = PySequence_Fast_GET_SIZE(values);
    ks = PySequence_Fast_ITEMS(keys);
    vs = PySequence_Fast_ITEMS(values);
    size = 1 + 2 * array_head(NULL, n) + tail.len;
    for (i = 0; i < n; i++) {
        PyObject *key = ks[i], *value = vs[i];
        if (!PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) > (Py_ssize_t) UINT32_MAX) {
            PyBuffer_Release(&tail);
            Py_RETURN_NONE;
        }
        size += bin_head(NULL, PyBytes_GET_SIZE(value)) + PyBytes_GET_SIZE(value);
        if (key == Py_None) {
            size += 1;
        } else if (PyBytes_CheckExact(key) && PyBytes_GET_SIZE(key) <= (Py_ssize_t) UINT32_MAX) {
            size += bin_head(NULL, PyBytes_GET_SIZE(key)) + PyBytes_GET_SIZE(key);
        } else {
            PyBuffer_Release(&tail);
            Py_RETURN_NONE;
        }
    }
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) {
        PyBuffer_Release(&tail);
        return NULL;
    }
    p = (unsigned char *) PyBytes_AS_STRING(out);
    *p++ = 0x94;
    p += array_head(p, n);
    for (i = 0; i < n; i++) {
        if (ks[i] == Py_None) {
            *p++ = 0xc0;
        } else {
            Py_ssize_t len = PyBytes_GET_SIZE(ks[i]);
            p += bin_head(p, len);
            memcpy(p, PyBytes_AS_STRING(ks[i]), (size_t) len);
            p += len;
        }
    }
    p += array_head(p, n);
    for (i = 0; i < n; i++) {
        Py_ssize_t len = PyBytes_GET_SIZE(vs[i]);
        p += bin_head(p, len);
        memcpy(p, PyBytes_AS_STRING(vs[i]), (size_t) len);
        p += len;
    }
    memcpy(p, tail.buf, (size_t) tail.len);
    PyBuffer_Release(&tail);
    return out;
}

/* appended_head(head_type, blake2b, sign_open, persons, namespace, head, owner, queue_id, epoch, base,
   base_fold, leaves, ours_end) -> the head's leaf (digest, end), or None.

   A live push's check in one pass (latticed.crdt.epoch_delta._append, where the piece's one tip's head is
   also its start head; append_compiled.py): head exactly of head_type with every field of the signed
   layout (hashes exact bytes of 32, counters exact ints below 2^64, 1 <= version, start <= end <=
   2^63-1, a signature of exact bytes and 64 long), of queue_id and epoch; leaves a list or tuple of
   leaves (f_leaf, each an exact tuple whose digest is exact bytes) that fold from base_fold (32 bytes) to the head's log; version == base + len(leaves) +
   1; ours_end, the leaves' ends and the head's end never going back; and the signature libsodium's
   crypto_sign_open (by address, as PyNaCl's) accepts over namespace and the packed fields under owner (32
   bytes). Then the head's leaf (BLAKE2b of the 232 signed bytes, the body's personalisation) is set in
   its _leaf slot and returned. Reads only the head's slots, the leaves' items and the arguments, each
   type- and size-checked before use; writes only a 296-byte stack buffer, the libsodium output buffer
   of the same size and the _leaf slot. It decides no refusal: anything that does not hold answers None
   and the caller's Python path checks again and raises what it raises. */
typedef int (*sign_open_fn)(unsigned char *m, unsigned long long *mlen, const unsigned char *sm,
                            unsigned long long smlen, const unsigned char *pk);

/* An exact int below 2^64 through *out (1), or 0 (another type, negative, too big). */
static int a_u64(PyObject *obj, unsigned long long *out)
{
    if (!PyLong_CheckExact(obj)) {
        return 0;
    }
    *out = PyLong_AsUnsignedLongLong(obj);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Whether obj is exact bytes of size bytes. */
static int a_bytes(PyObject *obj, Py_ssize_t size)
{
    return PyBytes_CheckExact(obj) && PyBytes_GET_SIZE(obj) == size;
}

static PyObject *appended_head(PyObject *self, PyObject *args)
{
    static const int hash_at[5] = {24, 72, 120, 152, 192};
    static const int number_at[6] = {56, 64, 104, 112, 184, 224};
    PyObject *head_type, *persons, *namespace, *head, *owner, *queue_id, *epoch_obj, *base_obj, *base_fold;
    PyObject *leaves, *ours_end_obj, *fields[12] = {NULL}, *digest_obj = NULL, *leaf = NULL;
    unsigned long long blake2b, sign_open, epoch, base, ours_end, values[6], previous, mlen;
    unsigned char sm[64 + 232], m[64 + 232], log[72], next[32];
    const unsigned char *person_body, *person_log;
    PyObject **all;
    Py_ssize_t n, i;
    int k, opened;
    (void) self;
    if (!PyArg_ParseTuple(args, "OKKOOOOOOOOOO", &head_type, &blake2b, &sign_open, &persons, &namespace,
                          &head, &owner, &queue_id, &epoch_obj, &base_obj, &base_fold, &leaves,
                          &ours_end_obj)) {
        return NULL;
    }
    if (!PyType_Check(head_type) || Py_TYPE(head) != (PyTypeObject *) head_type || blake2b == 0
        || sign_open == 0 || !a_bytes(persons, 32) || !a_bytes(namespace, 24) || !a_bytes(owner, 32)
        || !a_bytes(queue_id, 32) || !a_bytes(base_fold, 32) || !a_u64(epoch_obj, &epoch) || !a_u64(base_obj, &base)
        || !a_u64(ours_end_obj, &ours_end) || (!PyList_CheckExact(leaves) && !PyTuple_CheckExact(leaves))) {
        Py_RETURN_NONE;
    }
    if (v_names_ready() < 0) {
        return NULL;
    }
    for (k = 0; k < 12; k++) {
        if ((fields[k] = PyObject_GetAttr(head, v_names[k])) == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                goto fail;
            }
            PyErr_Clear();  /* an empty slot: the Python path reads it and raises as it does */
            goto plain;
        }
    }
    /* The signed layout (HeadV2.check), packed as HeadV2.body does. */
    memcpy(sm + 64, PyBytes_AS_STRING(namespace), 24);
    for (k = 0; k < 5; k++) {
        PyObject *field = fields[v_hashes[k]];
        if (!PyBytes_CheckExact(field) || PyBytes_GET_SIZE(field) != 32) {
            goto plain;
        }
        memcpy(sm + 64 + hash_at[k], PyBytes_AS_STRING(field), 32);
    }
    for (k = 0; k < 6; k++) {
        if (!a_u64(fields[v_numbers[k]], &values[k])) {
            goto plain;
        }
        v_put_u64(sm + 64 + number_at[k], values[k]);
    }
    /* values: epoch, version, start, end, meta_version, timestamp */
    if (values[1] < 1 || values[2] > values[3] || values[3] > V_MAX_OFFSET) {
        goto plain;
    }
    if (!PyBytes_CheckExact(fields[11]) || PyBytes_GET_SIZE(fields[11]) != 64) {
        goto plain;
    }
    memcpy(sm, PyBytes_AS_STRING(fields[11]), 64);
    /* This queue's and epoch's, and the version right after the leaves the piece carries. */
    if (memcmp(PyBytes_AS_STRING(fields[0]), PyBytes_AS_STRING(queue_id), 32) != 0 || values[0] != epoch) {
        goto plain;
    }
    n = PySequence_Fast_GET_SIZE(leaves);
    all = PySequence_Fast_ITEMS(leaves);
    if ((unsigned long long) n >= values[1] || values[1] - 1 - (unsigned long long) n != base) {
        goto plain;
    }
    /* The leaves fold from base_fold to the head's log, their ends (after ours) never going back. */
    person_body = (const unsigned char *) PyBytes_AS_STRING(persons);
    person_log = person_body + 16;
    memcpy(log, PyBytes_AS_STRING(base_fold), 32);
    previous = ours_end;
    for (i = 0; i < n; i++) {
        const char *digest;
        unsigned long long end;
        /* Exact tuples of exact bytes only (f_leaf): it reads their storage, while Python's fold and
           the ends' order iterate and add them, which a subclass may answer otherwise. */
        if (!f_leaf(all[i], &digest, &end) || end < previous) {
            goto plain;
        }
        previous = end;
        memcpy(log + 32, digest, 32);
        v_put_u64(log + 64, end);
        if (((blake2b_fn) (uintptr_t) blake2b)(next, 32, log, sizeof log, NULL, 0, NULL, person_log) != 0) {
            goto plain;
        }
        memcpy(log, next, 32);
    }
    if (values[3] < previous || memcmp(log, PyBytes_AS_STRING(fields[3]), 32) != 0) {
        goto plain;
    }
    /* The owner's signature over the 232 signed bytes (the GIL released, as cffi's call releases it: sm
       and m are this frame's, owner an immutable bytes the arguments hold). */
    Py_BEGIN_ALLOW_THREADS
    opened = ((sign_open_fn) (uintptr_t) sign_open)(m, &mlen, sm, sizeof sm,
                                                     (const unsigned char *) PyBytes_AS_STRING(owner));
    Py_END_ALLOW_THREADS
    if (opened != 0) {
        goto plain;
    }
    if (((blake2b_fn) (uintptr_t) blake2b)(next, 32, sm + 64, 232, NULL, 0, NULL, person_body) != 0) {
        goto plain;
    }
    if ((digest_obj = PyBytes_FromStringAndSize((const char *) next, 32)) == NULL
        || (leaf = PyTuple_Pack(2, digest_obj, fields[5])) == NULL
        || PyObject_GenericSetAttr(head, v_names[12], leaf) < 0) {
        goto fail;
    }
    Py_DECREF(digest_obj);
    for (k = 0; k < 12; k++) {
        Py_DECREF(fields[k]);
    }
    return leaf;
plain:
    for (k = 0; k < 12; k++) {
        Py_XDECREF(fields[k]);
    }
    Py_RETURN_NONE;
fail:
    Py_XDECREF(digest_obj);
    Py_XDECREF(leaf);
    for (k = 0; k < 12; k++) {
        Py_XDECREF(fields[k]);
    }
    return NULL;
}

/* compact_head(head_type, blake2b, person_log, raw, ref, queue_id, epoch, shared_fold, tail, chained,
   records_end, empty_meta) -> a head of head_type, or None.

   A compact DELTA2's head as latticed.protocol.core2_compact._head_in reads it, in one pass over the
   list msgpack decoded (core2_head_compiled.py): raw exactly a list of 10 items, [version, log | nil,
   start, end, base_hash | nil, head_hash | nil, meta_version, meta_hash | nil, timestamp, signature]; the
   five counters exact ints (each within a signed 64-bit range) added to ref's (ref None: to 0), every
   sum within 0 .. 2^64-1, 1 <= version, start <= end <= 2^63-1; a hash sent exact bytes of 32, the
   signature exact bytes of 64. A left-out field only by the live case of its rule: the log folded from
   shared_fold (32 bytes) over tail (a list or tuple of at most 64 leaves, f_leaf, each an exact tuple
   whose digest is exact bytes) with libsodium's BLAKE2b (by address, as fold()); the base hash ref's
   where start is ref's; the head hash chained (the chain value after the records, which the caller
   hashed from ref's head hash at ref's end) where end is records_end; the meta hash ref's where the
   metadata version is ref's, else empty_meta (bytes, passed only when the delta carries no metadata)
   for version 0. ref exactly of head_type with exact-int counters and 32-byte hashes; queue_id exact
   bytes of 32, epoch an exact int below 2^64. Reads only those objects' items and slots, each type- and
   size-checked before use, with the GIL held; writes only a 72-byte stack buffer and the new head's
   slots. It decides no refusal: anything else (another
   rule, a value out of range, a type not plain) answers None and the caller's Python path reads the
   head and raises what it raises. */
static PyObject *c_names[9];
static const char *c_name_strings[9] = {
    "version", "start", "end", "meta_version", "timestamp", "base_hash", "head_hash", "meta_hash", "_leaf",
};

/* An exact int within a signed 64-bit range through *out (1), or 0. */
static int c_i64(PyObject *obj, long long *out)
{
    int overflow = 0;
    if (!PyLong_CheckExact(obj)) {
        return 0;
    }
    *out = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow != 0 || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static PyObject *compact_head(PyObject *self, PyObject *args)
{
    /* raw's counters by index, and ref's counter of each (c_names) */
    static const int counter_at[5] = {0, 2, 3, 6, 8};
    PyObject *head_type, *person, *raw, *ref, *queue_id, *epoch_obj, *shared_fold, *tail, *chained;
    PyObject *records_end_obj, *empty_meta, *item = NULL, *values[13] = {NULL};
    PyObject *ref_hashes[3] = {NULL, NULL, NULL}, **fields, **leaves;
    unsigned long long blake2b, epoch, records_end, sums[5], ref_counters[5] = {0, 0, 0, 0, 0};
    unsigned char joined[72], next[32];
    Py_ssize_t i, n, offsets[13];
    PyTypeObject *type;
    int k, direct;
    (void) self;
    if (!PyArg_ParseTuple(args, "OKOOOOOOOOOO", &head_type, &blake2b, &person, &raw, &ref, &queue_id,
                          &epoch_obj, &shared_fold, &tail, &chained, &records_end_obj, &empty_meta)) {
        return NULL;
    }
    if (!PyType_Check(head_type) || blake2b == 0 || !a_bytes(person, 16) || !PyList_CheckExact(raw)
        || PyList_GET_SIZE(raw) != 10 || (ref != Py_None && Py_TYPE(ref) != (PyTypeObject *) head_type)
        || !a_bytes(queue_id, 32) || !a_u64(epoch_obj, &epoch) || !a_u64(records_end_obj, &records_end)) {
        Py_RETURN_NONE;
    }
    type = (PyTypeObject *) head_type;
    if (v_names_ready() < 0) {
        return NULL;
    }
    for (k = 0; k < 9; k++) {
        if (c_names[k] == NULL && (c_names[k] = PyUnicode_InternFromString(c_name_strings[k])) == NULL) {
            return NULL;
        }
    }
    fields = PySequence_Fast_ITEMS(raw);
    /* The counters, each the sent difference plus ref's. */
    for (k = 0; k < 5; k++) {
        long long delta;
        if (!c_i64(fields[counter_at[k]], &delta)) {
            goto plain;
        }
        if (ref != Py_None) {
            PyObject *got = PyObject_GetAttr(ref, c_names[k]);
            int ok;
            if (got == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                    goto fail;
                }
                PyErr_Clear();
                goto plain;
            }
            ok = a_u64(got, &ref_counters[k]);
            Py_DECREF(got);
            if (!ok) {
                goto plain;
            }
        }
        if (delta < 0 ? (unsigned long long) -(delta + 1) + 1ULL > ref_counters[k]
                      : (unsigned long long) delta > ~0ULL - ref_counters[k]) {
            goto plain;  /* below 0 or past 2^64-1: Python's check says so */
        }
        sums[k] = delta < 0 ? ref_counters[k] - ((unsigned long long) -(delta + 1) + 1ULL)
                            : ref_counters[k] + (unsigned long long) delta;
    }
    /* sums: version, start, end, meta_version, timestamp */
    if (sums[0] < 1 || sums[1] > sums[2] || sums[2] > V_MAX_OFFSET) {
        goto plain;
    }
    if (ref != Py_None) {
        for (k = 0; k < 3; k++) {
            if ((ref_hashes[k] = PyObject_GetAttr(ref, c_names[5 + k])) == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                    goto fail;
                }
                PyErr_Clear();
                goto plain;
            }
        }
    }
    /* The hashes: sent, or the live case of each rule. */
    for (k = 0; k < 4; k++) {
        static const int at[4] = {1, 4, 5, 7};
        static const int slot[4] = {3, 6, 7, 9};
        PyObject *sent = fields[at[k]], *value = NULL;
        if (sent != Py_None) {
            value = sent;
        } else if (k == 0) {  /* the log: shared_fold folded over the tip's tail */
            if (!a_bytes(shared_fold, 32) || (!PyList_CheckExact(tail) && !PyTuple_CheckExact(tail))) {
                goto plain;
            }
            n = PySequence_Fast_GET_SIZE(tail);
            leaves = PySequence_Fast_ITEMS(tail);
            if (n > 64) {
                goto plain;
            }
            if (n == 0) {
                value = shared_fold;
            } else {
                memcpy(joined, PyBytes_AS_STRING(shared_fold), 32);
                for (i = 0; i < n; i++) {
                    const char *digest;
                    unsigned long long end;
                    /* Exact tuples of exact bytes only (f_leaf, as appended_head): it reads their
                       storage, while Python's fold iterates and adds them, which a subclass may answer
                       otherwise. */
                    if (!f_leaf(leaves[i], &digest, &end)) {
                        goto plain;
                    }
                    memcpy(joined + 32, digest, 32);
                    v_put_u64(joined + 64, end);
                    if (((blake2b_fn) (uintptr_t) blake2b)(next, 32, joined, sizeof joined, NULL, 0, NULL,
                                                           (const unsigned char *) PyBytes_AS_STRING(person))
                        != 0) {
                        goto plain;
                    }
                    memcpy(joined, next, 32);
                }
                if ((values[3] = PyBytes_FromStringAndSize((const char *) joined, 32)) == NULL) {
                    goto fail;
                }
                continue;
            }
        } else if (k == 1) {  /* the base hash: ref's, where the head starts where ref does */
            if (ref == Py_None || ref_counters[1] != sums[1]) {
                goto plain;
            }
            value = ref_hashes[0];
        } else if (k == 2) {  /* the head hash: the records' chain, where they end at the head's end */
            if (chained == Py_None || records_end != sums[2]) {
                goto plain;
            }
            value = chained;
        } else if (ref != Py_None && ref_counters[3] == sums[3]) {  /* the meta hash: ref's */
            value = ref_hashes[2];
        } else if (empty_meta != Py_None && sums[3] == 0) {  /* no metadata, version 0 */
            value = empty_meta;
        } else {
            goto plain;
        }
        if (!a_bytes(value, 32)) {
            goto plain;
        }
        Py_INCREF(value);
        values[slot[k]] = value;
    }
    if (!a_bytes(values[3], 32) || !a_bytes(fields[9], 64)) {
        goto plain;
    }
    /* The head, its slots set as the dataclass's __init__ sets them (_leaf None). */
    Py_INCREF(queue_id);
    values[0] = queue_id;
    Py_INCREF(epoch_obj);
    values[1] = epoch_obj;
    Py_INCREF(fields[9]);
    values[11] = fields[9];
    Py_INCREF(Py_None);
    values[12] = Py_None;
    if ((values[2] = PyLong_FromUnsignedLongLong(sums[0])) == NULL
        || (values[4] = PyLong_FromUnsignedLongLong(sums[1])) == NULL
        || (values[5] = PyLong_FromUnsignedLongLong(sums[2])) == NULL
        || (values[8] = PyLong_FromUnsignedLongLong(sums[3])) == NULL
        || (values[10] = PyLong_FromUnsignedLongLong(sums[4])) == NULL) {
        goto fail;
    }
    direct = v_offsets(type, offsets) == 0;
    if (direct) {
        if ((item = type->tp_alloc(type, 0)) == NULL) {
            goto fail;
        }
        for (k = 0; k < 13; k++) {
            *(PyObject **) ((char *) item + offsets[k]) = values[k];  /* the reference moves in */
            values[k] = NULL;
        }
        v_untrack(item);  /* atoms only, as versions() says */
    } else {
        if ((item = PyObject_Vectorcall(head_type, values, 12, NULL)) == NULL) {
            goto fail;
        }
    }
    for (k = 0; k < 13; k++) {
        Py_XDECREF(values[k]);
    }
    for (k = 0; k < 3; k++) {
        Py_XDECREF(ref_hashes[k]);
    }
    return item;
plain:
    for (k = 0; k < 13; k++) {
        Py_XDECREF(values[k]);
    }
    for (k = 0; k < 3; k++) {
        Py_XDECREF(ref_hashes[k]);
    }
    Py_RETURN_NONE;
fail:
    for (k = 0; k < 13; k++) {
        Py_XDECREF(values[k]);
    }
    for (k = 0; k < 3; k++) {
        Py_XDECREF(ref_hashes[k]);
    }
    return NULL;
}

/* compact_rows's pass: 1 and *out the (values, keys, timestamps) tuple, 0 (not the plain shape: None),
   or -1 (an error set). raw is held by the caller. */
static int r_columns(PyObject *raw, long long stamp, Py_ssize_t max_value, Py_ssize_t max_key, PyObject **out)
{
    PyObject *values = NULL, *keys = NULL, *stamps = NULL;
    Py_ssize_t n, i;
    if (!PyList_CheckExact(raw)) {
        return 0;
    }
    n = PyList_GET_SIZE(raw);
    if (n < 1) {
        return 0;
    }
    values = PyTuple_New(n);
    keys = PyTuple_New(n);
    stamps = PyTuple_New(n);
    if (values == NULL || keys == NULL || stamps == NULL) {
        goto fail;
    }
    /* PyTuple_New may run a garbage collection, and with it any finalizer, which may shrink raw: its
       size is read again after the last allocation of a GC-tracked object (nothing in the loop below
       runs Python code: exact types only, PyLong_FromLongLong allocates an untracked int). */
    if (PyList_GET_SIZE(raw) != n) {
        goto plain;
    }
    for (i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(raw, i), *key, *value, *headers, *when;
        long long step;
        if (!PyList_CheckExact(row) || PyList_GET_SIZE(row) != 4) {
            goto plain;
        }
        key = PyList_GET_ITEM(row, 0);
        value = PyList_GET_ITEM(row, 1);
        headers = PyList_GET_ITEM(row, 3);
        if (!PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) > max_value) {
            goto plain;
        }
        if (key != Py_None && !(PyBytes_CheckExact(key) && PyBytes_GET_SIZE(key) <= max_key)) {
            goto plain;
        }
        if (!(PyList_CheckExact(headers) && PyList_GET_SIZE(headers) == 0) && !(headers == Py_None && i > 0)) {
            goto plain;
        }
        if (!c_i64(PyList_GET_ITEM(row, 2), &step) || __builtin_add_overflow(stamp, step, &stamp)) {
            goto plain;
        }
        when = PyLong_FromLongLong(stamp);
        if (when == NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(stamps, i, when);
        Py_INCREF(value);
        PyTuple_SET_ITEM(values, i, value);
        Py_INCREF(key);
        PyTuple_SET_ITEM(keys, i, key);
    }
    if ((*out = PyTuple_Pack(3, values, keys, stamps)) == NULL) {
        goto fail;
    }
    Py_DECREF(values);
    Py_DECREF(keys);
    Py_DECREF(stamps);
    return 1;
plain:
    Py_DECREF(values);
    Py_DECREF(keys);
    Py_DECREF(stamps);
    return 0;
fail:
    Py_XDECREF(values);
    Py_XDECREF(keys);
    Py_XDECREF(stamps);
    return -1;
}

/* compact_rows(raw, base, max_value, max_key) -> (values, keys, timestamps) or None.

   raw: a compact DELTA2's decoded records (protocol/core2_compact.py, ``_restamped`` then
   wire.records_from_wire). Accepted only when it is a list of at least one item, each an exact list
   [key, value, step, headers]: key None or bytes of at most max_key, value bytes of at most max_value,
   step an int, headers an empty list (on every row) or None (on any row but the first: it repeats the
   empty list before it). The timestamps are base plus the steps so far, each sum within a signed 64-bit
   integer (base too). values/keys: tuples of those items (the same objects); timestamps: new ints.
   Anything else (headers that are not empty, a row of another shape, a sum past 64 bits): None, and the
   Python path reads the rows and raises or accepts as it does. Reads raw without changing it. */
static PyObject *compact_rows(PyObject *self, PyObject *args)
{
    PyObject *raw, *base_obj, *out = NULL;
    Py_ssize_t max_value, max_key;
    long long stamp;
    int found;
    (void) self;
    if (!PyArg_ParseTuple(args, "OOnn", &raw, &base_obj, &max_value, &max_key)) {
        return NULL;
    }
    if (!c_i64(base_obj, &stamp)) {
        Py_RETURN_NONE;
    }
    found = r_columns(raw, stamp, max_value, max_key, &out);
    if (found < 0) {
        return NULL;
    }
    if (found == 0) {
        Py_RETURN_NONE;
    }
    return out;
}

/* compact_delta(raw, base, max_value, max_key) -> (seq, base_diff, epoch, head, meta, from_offset,
   (values, keys, timestamps), steps_diff, packed) or None.

   raw: a compact DELTA2 as msgpack decoded it (protocol/core2_compact.py, ``Compact2Link._decode_delta``),
   read in one pass when it is exactly a live push's shape: an exact list of 10, [39, seq, queue, nil,
   log, meta, from_offset, records, bodies, steps] with seq an int below 2^64, queue an int, the summary
   nil, log [base_diff (an int within 64 bits), nil, epoch (below 2^64), b"" (no shared leaves), [[head,
   b""]] (one tip, no tail), 0 (the start head is that tip's)], meta [] or nil, from_offset nil or an int
   0 to 2^63-1, records as compact_rows reads them (timestamps from base), bodies [], steps nil or
   [steps_diff (an int within 64 bits), bytes]. head is the tip's compact head, a list of 10 returned
   unread (compact_head reads it); meta True where raw carried [] (no metadata pairs), False for nil; the ints
   and bytes returned are raw's own objects. Anything else: None, and the Python path reads the message
   and raises or accepts as it does. Reads raw without changing it. */
static PyObject *compact_delta(PyObject *self, PyObject *args)
{
    PyObject *raw, *base_obj, *log, *tips, *tip, *meta, *from, *bodies, *steps, *rows, *columns = NULL;
    PyObject *steps_diff = Py_None, *packed = Py_None, *held[9] = {NULL}, *out;
    PyObject **f, **g;
    Py_ssize_t max_value, max_key;
    unsigned long long u;
    long long stamp, s;
    int found, k;
    (void) self;
    if (!PyArg_ParseTuple(args, "OOnn", &raw, &base_obj, &max_value, &max_key)) {
        return NULL;
    }
    if (!c_i64(base_obj, &stamp) || !PyList_CheckExact(raw) || PyList_GET_SIZE(raw) != 10) {
        Py_RETURN_NONE;
    }
    /* Every check below reads exact types only and allocates nothing (no Python code runs, raw cannot
       change) until each object kept is held; r_columns then allocates and reads its rows again. */
    f = PySequence_Fast_ITEMS(raw);
    if (!c_i64(f[0], &s) || s != 39 || !a_u64(f[1], &u) || !PyLong_CheckExact(f[2]) || f[3] != Py_None) {
        Py_RETURN_NONE;
    }
    log = f[4];
    meta = f[5];
    from = f[6];
    rows = f[7];
    bodies = f[8];
    steps = f[9];
    if (!PyList_CheckExact(log) || PyList_GET_SIZE(log) != 6) {
        Py_RETURN_NONE;
    }
    g = PySequence_Fast_ITEMS(log);
    tips = g[4];
    if (!c_i64(g[0], &s) || g[1] != Py_None || !a_u64(g[2], &u) || !a_bytes(g[3], 0)
        || !PyList_CheckExact(tips) || PyList_GET_SIZE(tips) != 1 || !c_i64(g[5], &s) || s != 0) {
        Py_RETURN_NONE;
    }
    tip = PyList_GET_ITEM(tips, 0);
    if (!PyList_CheckExact(tip) || PyList_GET_SIZE(tip) != 2 || !PyList_CheckExact(PyList_GET_ITEM(tip, 0))
        || PyList_GET_SIZE(PyList_GET_ITEM(tip, 0)) != 10 || !a_bytes(PyList_GET_ITEM(tip, 1), 0)) {
        Py_RETURN_NONE;
    }
    if (!(meta == Py_None || (PyList_CheckExact(meta) && PyList_GET_SIZE(meta) == 0))) {
        Py_RETURN_NONE;
    }
    if (from != Py_None && !(c_i64(from, &s) && s >= 0)) {
        Py_RETURN_NONE;  /* an offset: 0 to 2^63-1 */
    }
    if (!PyList_CheckExact(bodies) || PyList_GET_SIZE(bodies) != 0) {
        Py_RETURN_NONE;
    }
    if (steps != Py_None) {
        if (!PyList_CheckExact(steps) || PyList_GET_SIZE(steps) != 2 || !c_i64(PyList_GET_ITEM(steps, 0), &s)
            || !PyBytes_CheckExact(PyList_GET_ITEM(steps, 1))) {
            Py_RETURN_NONE;
        }
        steps_diff = PyList_GET_ITEM(steps, 0);
        packed = PyList_GET_ITEM(steps, 1);
    }
    /* Held: what is returned, and the rows' list (a collection inside r_columns may empty raw). */
    held[0] = f[1];
    held[1] = g[0];
    held[2] = g[2];
    held[3] = PyList_GET_ITEM(tip, 0);
    held[4] = meta == Py_None ? Py_False : Py_True;
    held[5] = from;
    held[6] = steps_diff;
    held[7] = packed;
    held[8] = rows;
    for (k = 0; k < 9; k++) {
        Py_INCREF(held[k]);
    }
    found = r_columns(rows, stamp, max_value, max_key, &columns);
    if (found <= 0) {
        for (k = 0; k < 9; k++) {
            Py_DECREF(held[k]);
        }
        if (found < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    out = PyTuple_Pack(9, held[0], held[1], held[2], held[3], held[4], held[5], columns, held[6], held[7]);
    for (k = 0; k < 9; k++) {
        Py_DECREF(held[k]);
    }
    Py_DECREF(columns);
    return out;
}

static PyMethodDef methods[] = {
    {"offered", offered, METH_VARARGS, "An offer's records as value and key columns, and their packed size."},
    {"packed", packed, METH_VARARGS, "Value and key columns as the compiled chain hasher takes them."},
    {"pieces", pieces, METH_VARARGS, "Consecutive fixed-size pieces of a bytes-like object."},
    {"cuts", cuts, METH_VARARGS, "Where the owner ends signed slices of a run."},
    {"widest", widest, METH_VARARGS, "The longest value and the longest key of two columns."},
    {"same_int", same_int, METH_O, "Whether every item of a column is an int equal to the first."},
    {"segment_data", segment_data, METH_VARARGS, "A segment's stored data: key and value columns packed, then the rest."},
    {"unpacked", unpacked, METH_VARARGS, "An offer sent as packed columns: value and key columns, and its records packed."},
    {"versions", versions, METH_VARARGS, "The head bodies and leaves a log's steps encode."},
    {"are_leaves", are_leaves, METH_O, "Whether every item of a list or tuple is a leaf of the log."},
    {"packed_bodies", packed_bodies, METH_VARARGS, "Each v2 head's signed bytes and signature."},
    {"unvouched", unvouched, METH_VARARGS, "The bodies a pass over the log and the chain does not confirm."},
    {"fold", fold, METH_VARARGS, "The log folded over leaves, and its value after every stride of them."},
    {"chain_run", chain_run, METH_VARARGS, "The chain values after a few records, hashed from their columns."},
    {"appended_head", appended_head, METH_VARARGS, "A live push's head, leaves and signature checked in one pass."},
    {"compact_head", compact_head, METH_VARARGS, "A compact DELTA2's head read from its decoded list in one pass."},
    {"compact_rows", compact_rows, METH_VARARGS, "A compact DELTA2's plain records as columns, restamped."},
    {"compact_delta", compact_delta, METH_VARARGS, "A live compact DELTA2's fields and records in one pass."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columns", "The column passes of the owner's bulk append, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* A tuple of n strings, or of n ints (strings NULL), new. */
static PyObject *m_tuple(const char *const *strings, const int *ints, int n)
{
    PyObject *out = PyTuple_New(n);
    int i;
    for (i = 0; out != NULL && i < n; i++) {
        PyObject *item = strings != NULL ? PyUnicode_FromString(strings[i]) : PyLong_FromLong(ints[i]);
        if (item == NULL) {
            Py_CLEAR(out);
        } else {
            PyTuple_SET_ITEM(out, i, item);
        }
    }
    return out;
}

/* PyModule_Add (3.13) by hand: value (new, or NULL on an error) added as name, its reference released. */
static int m_add(PyObject *m, const char *name, PyObject *value)
{
    int failed = value == NULL || PyModule_AddObjectRef(m, name, value) < 0;
    Py_XDECREF(value);
    return failed ? -1 : 0;
}

/* The module, with the tables above that must match HeadV2 (tests compare them with its slots). */
PyMODINIT_FUNC PyInit__columns(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (m_add(m, "HEAD_SLOTS", m_tuple(v_name_strings, NULL, 13)) < 0
        || m_add(m, "HEAD_HASH_SLOTS", m_tuple(NULL, v_hashes, 5)) < 0
        || m_add(m, "HEAD_COUNTER_SLOTS", m_tuple(NULL, v_numbers, 6)) < 0
        || m_add(m, "REF_SLOTS", m_tuple(c_name_strings, NULL, 9)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
