"""Build script of the optional compiled chain hasher, ``latticed.crdt._chainhash`` (cffi API mode).

Why it exists: extending the hash chain over a batch (:func:`latticed.crdt.records.chain_extend`, the
hot path of signing and of verifying) costs a few Python-level C calls per record (encode, copy a
personalised hasher, update, digest, then the chain step), about 1 us a record; this hashes a whole
batch's columns in one call with the GIL released. The chain values are byte for byte those of the
pure-Python path, which stays the fallback when this is not built.

It neither includes nor links libsodium: the caller passes the address of PyNaCl's own
``crypto_generichash_blake2b_salt_personal`` (BLAKE2b with a 16-byte personalisation and a zero salt,
what ``hashlib.blake2b(person=...)`` computes). setup.py builds it as an optional extension; by hand:
``python latticed/crdt/_chain_build.py`` (writes the module next to this file).
"""

from __future__ import annotations

import sys

from cffi import FFI

MODULE = "latticed.crdt._chainhash"

CDEF = """
int latticed_chain_extend(uintptr_t blake2b, const unsigned char *record_person,
                          const unsigned char *chain_person, const unsigned char *base, uint64_t first_offset,
                          const unsigned char *values, size_t values_size, const uint32_t *value_lengths,
                          const unsigned char *keys, size_t keys_size, const int32_t *key_lengths,
                          const int64_t *timestamps, const unsigned char *tails, size_t tails_size,
                          const uint32_t *tail_lengths, size_t n, unsigned char *out, size_t out_size);
"""

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#ifdef _WIN32
#define sched_yield() ((void) 0)  /* no helper thread there: nothing to wait for */
#else
#include <pthread.h>
#include <sched.h>
#endif

/* libsodium's crypto_generichash_blake2b_salt_personal, declared here: no header is needed. */
typedef int (*blake2b_fn)(unsigned char *out, size_t outlen, const unsigned char *in,
                          unsigned long long inlen, const unsigned char *key, size_t keylen,
                          const unsigned char *salt, const unsigned char *personal);

#define DIGEST 32
#define FIXED 25   /* offset u64 | timestamp i64 | has_key u8 | key length u32 | value length u32 */

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char) (v >> 24); p[1] = (unsigned char) (v >> 16);
    p[2] = (unsigned char) (v >> 8); p[3] = (unsigned char) v;
}

static void put_u64(unsigned char *p, uint64_t v)
{
    put_u32(p, (uint32_t) (v >> 32));
    put_u32(p + 4, (uint32_t) v);
}

/* Record digests of records [lo, hi) into out (32 bytes each, at the record's index): the bytes of
   record lo start at values, keys and tails (tails: all of it for every record when tail_lengths is
   NULL). scratch holds the biggest record. Returns 0, or -3 if libsodium refused. */
struct digests {
    blake2b_fn hash;
    const unsigned char *person, *values, *keys, *tails;
    const uint32_t *value_lengths, *tail_lengths;
    const int32_t *key_lengths;
    const int64_t *timestamps;
    uint64_t first_offset;
    size_t tails_size, lo, hi, biggest;
    unsigned char *out;
};

static int digest_range(struct digests *d, unsigned char *scratch)
{
    size_t i;
    const unsigned char *values = d->values, *keys = d->keys, *tails = d->tails;
    for (i = d->lo; i < d->hi; i++) {
        size_t klen = d->key_lengths[i] < 0 ? 0 : (size_t) d->key_lengths[i];
        size_t vlen = d->value_lengths[i];
        size_t tlen = d->tail_lengths ? d->tail_lengths[i] : d->tails_size;
        unsigned char *p = scratch;
        put_u64(p, d->first_offset + i);
        put_u64(p + 8, (uint64_t) d->timestamps[i]);
        p[16] = d->key_lengths[i] >= 0;
        put_u32(p + 17, (uint32_t) klen);
        put_u32(p + 21, (uint32_t) vlen);
        p += FIXED;
        memcpy(p, keys, klen);
        p += klen;
        memcpy(p, values, vlen);
        p += vlen;
        memcpy(p, tails, tlen);
        p += tlen;
        keys += klen;
        values += vlen;
        if (d->tail_lengths) {
            tails += tlen;
        }
        if (d->hash(d->out + i * DIGEST, DIGEST, scratch, (unsigned long long) (p - scratch), NULL, 0, NULL,
                    d->person) != 0) {
            return -3;
        }
    }
    return 0;
}

/* A batch's digests, shared by the caller and a helper thread: each takes the next CHUNK records
   until none is left. The helper may start late or never (both cores busy): the caller then digests
   every chunk itself and waits only for chunks the helper took and has not finished. The helper reads
   the caller's columns only inside a chunk it took, so once every chunk is done the caller may return;
   this block is freed by whichever of the two lets go of it last. */
#define CHUNK 128
struct work {
    struct digests d;       /* d.out: the digests, n * 32 bytes */
    size_t chunks;
    size_t *starts;         /* per chunk, where its values, keys and tails begin */
    atomic_size_t next;
    atomic_int refs;
    atomic_uchar *done;     /* per chunk: 0 while being digested, 1 done, 2 libsodium refused */
};

static void let_go(struct work *w)
{
    if (atomic_fetch_sub(&w->refs, 1) == 1) {
        free(w->starts);
        free((void *) w->done);
        free(w->d.out);
        free(w);
    }
}

static void take_chunks(struct work *w, unsigned char *scratch)
{
    for (;;) {
        size_t c = atomic_fetch_add(&w->next, 1);
        struct digests d = w->d;
        if (c >= w->chunks) {
            return;
        }
        d.lo = c * CHUNK;
        d.hi = d.lo + CHUNK < d.hi ? d.lo + CHUNK : d.hi;
        d.values += w->starts[3 * c];
        d.keys += w->starts[3 * c + 1];
        if (d.tail_lengths) {
            d.tails += w->starts[3 * c + 2];
        }
        atomic_store_explicit(&w->done[c], digest_range(&d, scratch) ? 2 : 1, memory_order_release);
    }
}

#ifndef _WIN32
static void *helper(void *arg)
{
    struct work *w = arg;
    unsigned char *scratch = malloc(w->d.biggest ? w->d.biggest : 1);
    if (scratch != NULL) {
        take_chunks(w, scratch);
        free(scratch);
    }
    let_go(w);
    return NULL;
}
#endif

/* The chain values after each of n records, from base (the chain value at first_offset), into out
   (n * 32 bytes). Record i's canonical bytes are FIXED | key | value | tail: its value is the next
   value_lengths[i] bytes of values, its key the next key_lengths[i] bytes of keys (-1: no key), its
   tail (the encoded headers) the next tail_lengths[i] bytes of tails, or all of tails for every record
   when tail_lengths is NULL. digest = H_record(bytes), chain = H_chain(previous | digest). Returns 0; -1
   if the sizes disagree (before anything is hashed), -2 if no memory, -3 if libsodium refused.

   The digests (two thirds of the hashing) do not depend on each other, only the chain does: for a batch
   of PARALLEL_MIN records or more a helper thread digests chunks beside the caller, which then chains
   them. The caller is the daemon's storage thread, which every write waits for. */
#define PARALLEL_MIN 2048
int latticed_chain_extend(uintptr_t blake2b, const unsigned char *record_person,
                          const unsigned char *chain_person, const unsigned char *base, uint64_t first_offset,
                          const unsigned char *values, size_t values_size, const uint32_t *value_lengths,
                          const unsigned char *keys, size_t keys_size, const int32_t *key_lengths,
                          const int64_t *timestamps, const unsigned char *tails, size_t tails_size,
                          const uint32_t *tail_lengths, size_t n, unsigned char *out, size_t out_size)
{
    blake2b_fn hash = (blake2b_fn) blake2b;
    size_t i, c, vtotal = 0, ktotal = 0, ttotal = 0, biggest = 0;
    unsigned char *scratch, *digests, link[2 * DIGEST];
    const unsigned char *previous = base;
    struct work *w;
    int status = 0;
    if (out_size != n * DIGEST) {
        return -1;
    }
    if (n == 0) {
        return 0;
    }
    w = calloc(1, sizeof *w);
    if (w == NULL) {
        return -2;
    }
    w->chunks = (n + CHUNK - 1) / CHUNK;
    w->starts = malloc(3 * w->chunks * sizeof *w->starts);
    w->done = calloc(w->chunks, sizeof *w->done);
    w->d.out = malloc(n * DIGEST);
    if (w->starts == NULL || w->done == NULL || w->d.out == NULL) {
        free(w->starts), free((void *) w->done), free(w->d.out), free(w);
        return -2;
    }
    for (i = 0; i < n; i++) {
        size_t klen = key_lengths[i] < 0 ? 0 : (size_t) key_lengths[i];
        size_t tlen = tail_lengths ? tail_lengths[i] : tails_size;
        size_t size = FIXED + klen + value_lengths[i] + tlen;
        if (key_lengths[i] < -1) {
            status = -1;
            break;
        }
        if (i % CHUNK == 0) {
            w->starts[3 * (i / CHUNK)] = vtotal;
            w->starts[3 * (i / CHUNK) + 1] = ktotal;
            w->starts[3 * (i / CHUNK) + 2] = ttotal;
        }
        vtotal += value_lengths[i];
        ktotal += klen;
        ttotal += tlen;
        if (size > biggest) {
            biggest = size;
        }
    }
    if (status || vtotal != values_size || ktotal != keys_size || (tail_lengths && ttotal != tails_size)) {
        w->refs = 1;
        let_go(w);
        return -1;
    }
    scratch = malloc(biggest);
    if (scratch == NULL) {
        w->refs = 1;
        let_go(w);
        return -2;
    }
    w->d.hash = hash;
    w->d.person = record_person;
    w->d.values = values;
    w->d.keys = keys;
    w->d.tails = tails;
    w->d.value_lengths = value_lengths;
    w->d.tail_lengths = tail_lengths;
    w->d.key_lengths = key_lengths;
    w->d.timestamps = timestamps;
    w->d.first_offset = first_offset;
    w->d.tails_size = tails_size;
    w->d.hi = n;
    w->d.biggest = biggest;
    atomic_init(&w->next, 0);
    atomic_init(&w->refs, 1);
#ifndef _WIN32
    if (n >= PARALLEL_MIN) {
        pthread_t thread;
        pthread_attr_t attr;
        atomic_store(&w->refs, 2);
        if (pthread_attr_init(&attr) != 0 || pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) != 0
            || pthread_create(&thread, &attr, helper, w) != 0) {
            atomic_store(&w->refs, 1);  /* no helper: every chunk is digested here */
        }
        pthread_attr_destroy(&attr);
    }
#endif
    take_chunks(w, scratch);
    free(scratch);
    for (c = 0; c < w->chunks; c++) {  /* chunks the helper took: wait for them to be done */
        unsigned char state;
        while ((state = atomic_load_explicit(&w->done[c], memory_order_acquire)) == 0) {
            sched_yield();
        }
        if (state == 2) {
            status = -3;
        }
    }
    digests = w->d.out;
    for (i = 0; i < n && !status; i++) {
        memcpy(link, previous, DIGEST);
        memcpy(link + DIGEST, digests + i * DIGEST, DIGEST);
        if (hash(out, DIGEST, link, sizeof link, NULL, 0, NULL, chain_person) != 0) {
            status = -3;
        }
        previous = out;
        out += DIGEST;
    }
    let_go(w);
    return status;
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(MODULE, SOURCE, libraries=[] if sys.platform == "win32" else ["pthread"])

if __name__ == "__main__":  # by hand: build in a scratch directory, keep only the module, next to this file
    import shutil
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as scratch:
        built = Path(scratch, ffibuilder.compile(tmpdir=scratch))
        shutil.copy(built, Path(__file__).with_name(built.name))
