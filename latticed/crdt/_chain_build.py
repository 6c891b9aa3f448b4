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

/* The chain values after each of n records, from base (the chain value at first_offset), into out
   (n * 32 bytes). Record i's canonical bytes are FIXED | key | value | tail: its value is the next
   value_lengths[i] bytes of values, its key the next key_lengths[i] bytes of keys (-1: no key), its
   tail (the encoded headers) the next tail_lengths[i] bytes of tails, or all of tails for every record
   when tail_lengths is NULL. digest = H_record(bytes), chain = H_chain(previous | digest). Returns 0; -1
   if the sizes disagree (before anything is hashed), -2 if no memory, -3 if libsodium refused. */
int latticed_chain_extend(uintptr_t blake2b, const unsigned char *record_person,
                          const unsigned char *chain_person, const unsigned char *base, uint64_t first_offset,
                          const unsigned char *values, size_t values_size, const uint32_t *value_lengths,
                          const unsigned char *keys, size_t keys_size, const int32_t *key_lengths,
                          const int64_t *timestamps, const unsigned char *tails, size_t tails_size,
                          const uint32_t *tail_lengths, size_t n, unsigned char *out, size_t out_size)
{
    blake2b_fn hash = (blake2b_fn) blake2b;
    size_t i, vtotal = 0, ktotal = 0, ttotal = 0, biggest = 0;
    unsigned char *scratch, link[2 * DIGEST];
    const unsigned char *previous = base;
    if (out_size != n * DIGEST) {
        return -1;
    }
    for (i = 0; i < n; i++) {
        size_t klen = key_lengths[i] < 0 ? 0 : (size_t) key_lengths[i];
        size_t tlen = tail_lengths ? tail_lengths[i] : tails_size;
        size_t size = FIXED + klen + value_lengths[i] + tlen;
        if (key_lengths[i] < -1) {
            return -1;
        }
        vtotal += value_lengths[i];
        ktotal += klen;
        ttotal += tlen;
        if (size > biggest) {
            biggest = size;
        }
    }
    if (vtotal != values_size || ktotal != keys_size || (tail_lengths && ttotal != tails_size)) {
        return -1;
    }
    scratch = malloc(biggest ? biggest : 1);
    if (scratch == NULL) {
        return -2;
    }
    for (i = 0; i < n; i++) {
        size_t klen = key_lengths[i] < 0 ? 0 : (size_t) key_lengths[i];
        size_t vlen = value_lengths[i];
        size_t tlen = tail_lengths ? tail_lengths[i] : tails_size;
        unsigned char *p = scratch;
        put_u64(p, first_offset + i);
        put_u64(p + 8, (uint64_t) timestamps[i]);
        p[16] = key_lengths[i] >= 0;
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
        if (tail_lengths) {
            tails += tlen;
        }
        memcpy(link, previous, DIGEST);
        if (hash(link + DIGEST, DIGEST, scratch, (unsigned long long) (p - scratch), NULL, 0, NULL,
                 record_person) != 0
            || hash(out, DIGEST, link, sizeof link, NULL, 0, NULL, chain_person) != 0) {
            free(scratch);
            return -3;
        }
        previous = out;
        out += DIGEST;
    }
    free(scratch);
    return 0;
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(MODULE, SOURCE)

if __name__ == "__main__":  # by hand: build in a scratch directory, keep only the module, next to this file
    import shutil
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as scratch:
        built = Path(scratch, ffibuilder.compile(tmpdir=scratch))
        shutil.copy(built, Path(__file__).with_name(built.name))
