"""Build script of the optional compiled batch sealer, ``latticed.privacy._sealbatch`` (cffi API mode).

Why it exists: sealing a batch from Python costs one libsodium call per record through cffi (~0.66 us of
argument conversion and GIL release each) plus the Python that builds each envelope; this seals a whole
batch, or opens one, in one call with the GIL released. The envelopes are byte for byte those of the
pure-Python path in :mod:`latticed.privacy.crypto`, which stays the fallback when this is not built.
libsodium's own work (~0.55 us per short record: a subkey and three ChaCha20 blocks per nonce) is what is
left, so a large batch is sealed in two halves, the second on a short-lived thread: the event loop that
waits for it is blocked half as long, and the storage thread is idle meanwhile when one batch is in flight.

It neither includes nor links libsodium (a machine may have no headers or no system library): the caller
passes the address of PyNaCl's own ``crypto_aead_xchacha20poly1305_ietf_encrypt`` / ``_decrypt`` as an
integer, and the function-pointer types are declared here. setup.py builds it as an optional extension;
by hand: ``python latticed/privacy/_seal_build.py`` (writes the module next to this file).
"""

from __future__ import annotations

from cffi import FFI

MODULE = "latticed.privacy._sealbatch"

CDEF = """
int latticed_seal_batch(uintptr_t encrypt, const unsigned char *key, const unsigned char *ad, size_t adlen,
                        const unsigned char *head, const unsigned char *prefix, size_t prefix_len,
                        const unsigned char *parts, size_t parts_size, const uint32_t *lengths, size_t n,
                        size_t max_inner, const unsigned char *nonces, size_t nonces_size,
                        unsigned char *out, size_t out_size, uint64_t *bounds, size_t split_from);
long latticed_open_batch(uintptr_t decrypt, const unsigned char *key, const unsigned char *ad,
                         size_t adlen, const unsigned char *envelopes, size_t envelopes_size,
                         const uint32_t *lengths, size_t n, unsigned char *out, size_t out_size);
"""

SOURCE = r"""
#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* libsodium's signatures (crypto_aead_xchacha20poly1305.h), declared here: no header is needed. */
typedef int (*aead_encrypt_fn)(unsigned char *c, unsigned long long *clen_p, const unsigned char *m,
                               unsigned long long mlen, const unsigned char *ad,
                               unsigned long long adlen, const unsigned char *nsec,
                               const unsigned char *npub, const unsigned char *k);
typedef int (*aead_decrypt_fn)(unsigned char *m, unsigned long long *mlen_p, unsigned char *nsec,
                               const unsigned char *c, unsigned long long clen,
                               const unsigned char *ad, unsigned long long adlen,
                               const unsigned char *npub, const unsigned char *k);

#define HEAD_SIZE 5    /* version u8 | epoch u32 */
#define NONCE_SIZE 24
#define TAG_SIZE 16
#define OVERHEAD (HEAD_SIZE + NONCE_SIZE + TAG_SIZE)

/* A run of records to seal: envelope i goes to out + bounds[i] - bounds[0]. */
struct seal_run {
    aead_encrypt_fn seal;
    const unsigned char *key, *ad, *head, *prefix, *parts, *nonces;
    size_t adlen, prefix_len, n;
    const uint32_t *lengths;
    unsigned char *out;
    int status;
};

/* Each inner record is copied to its place and encrypted there: libsodium's XChaCha20-Poly1305 XORs the
   stream block by block and MACs the ciphertext after, so c == m is allowed. */
static void *seal_records(void *arg)
{
    struct seal_run *run = arg;
    const unsigned char *parts = run->parts, *nonces = run->nonces;
    unsigned char *out = run->out;
    size_t i;
    for (i = 0; i < run->n; i++) {
        size_t size = run->prefix_len + run->lengths[i];
        unsigned char *body = out + HEAD_SIZE + NONCE_SIZE;
        memcpy(out, run->head, HEAD_SIZE);
        memcpy(out + HEAD_SIZE, nonces, NONCE_SIZE);
        memcpy(body, run->prefix, run->prefix_len);
        memcpy(body + run->prefix_len, parts, run->lengths[i]);
        if (run->seal(body, NULL, body, size, run->ad, run->adlen, NULL, nonces, run->key) != 0) {
            run->status = -2;
            return NULL;
        }
        parts += run->lengths[i];
        nonces += NONCE_SIZE;
        out += OVERHEAD + size;
    }
    return NULL;
}

/* Envelope i = head | nonce i | AEAD(prefix | part i), one after the other in out; bounds[i] and
   bounds[i + 1] are where envelope i starts and ends in out (n + 1 entries). From split_from records on
   (0: never) the second half is sealed on a thread of its own meanwhile (each half writes only its own
   part of out). Returns 0; -1 if the sizes disagree or -3 if an inner record is over max_inner (both
   before anything is written); -2 if libsodium refused. */
int latticed_seal_batch(uintptr_t encrypt, const unsigned char *key, const unsigned char *ad, size_t adlen,
                        const unsigned char *head, const unsigned char *prefix, size_t prefix_len,
                        const unsigned char *parts, size_t parts_size, const uint32_t *lengths, size_t n,
                        size_t max_inner, const unsigned char *nonces, size_t nonces_size,
                        unsigned char *out, size_t out_size, uint64_t *bounds, size_t split_from)
{
    struct seal_run first, second;
    pthread_t helper;
    size_t i, total = 0, half = (split_from && n >= split_from) ? n / 2 : 0, half_parts = 0;
    for (i = 0; i < n; i++) {
        if (prefix_len + lengths[i] > max_inner) {
            return -3;
        }
        if (i == half) {
            half_parts = total;
        }
        total += lengths[i];
    }
    if (total != parts_size || out_size != total + n * (OVERHEAD + prefix_len)
        || nonces_size != n * NONCE_SIZE) {
        return -1;
    }
    bounds[0] = 0;
    for (i = 0; i < n; i++) {
        bounds[i + 1] = bounds[i] + OVERHEAD + prefix_len + lengths[i];
    }
    first.seal = (aead_encrypt_fn) encrypt;
    first.key = key;
    first.ad = ad;
    first.adlen = adlen;
    first.head = head;
    first.prefix = prefix;
    first.prefix_len = prefix_len;
    first.status = 0;
    second = first;
    first.parts = parts;
    first.nonces = nonces;
    first.lengths = lengths;
    first.out = out;
    first.n = n;
    if (half) {
        second.parts = parts + half_parts;
        second.nonces = nonces + half * NONCE_SIZE;
        second.lengths = lengths + half;
        second.out = out + bounds[half];
        second.n = n - half;
        if (pthread_create(&helper, NULL, seal_records, &second) == 0) {
            first.n = half;
            seal_records(&first);
            pthread_join(helper, NULL);
            return first.status ? first.status : second.status;
        }
    }
    seal_records(&first); /* small, or no thread to be had: all of it here */
    return first.status;
}

/* The inner records of n envelopes (one after the other in envelopes, all of one key and AD), one after
   the other in out. Returns 0, -1 if the sizes disagree (nothing opened), or i + 1 if envelope i does not
   verify (out is then partly written). The caller has checked each envelope's version and epoch. */
long latticed_open_batch(uintptr_t decrypt, const unsigned char *key, const unsigned char *ad,
                         size_t adlen, const unsigned char *envelopes, size_t envelopes_size,
                         const uint32_t *lengths, size_t n, unsigned char *out, size_t out_size)
{
    aead_decrypt_fn open = (aead_decrypt_fn) decrypt;
    size_t i, total = 0, need = 0;
    for (i = 0; i < n; i++) {
        if (lengths[i] < OVERHEAD) {
            return -1;
        }
        total += lengths[i];
        need += lengths[i] - OVERHEAD;
    }
    if (total != envelopes_size || need != out_size) {
        return -1;
    }
    for (i = 0; i < n; i++) {
        const unsigned char *nonce = envelopes + HEAD_SIZE;
        size_t clen = lengths[i] - HEAD_SIZE - NONCE_SIZE;
        if (open(out, NULL, NULL, nonce + NONCE_SIZE, clen, ad, adlen, nonce, key) != 0) {
            return (long) i + 1;
        }
        envelopes += lengths[i];
        out += clen - TAG_SIZE;
    }
    return 0;
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(MODULE, SOURCE, extra_compile_args=["-pthread"], extra_link_args=["-pthread"])

if __name__ == "__main__":  # by hand: build in a scratch directory, keep only the module, next to this file
    import shutil
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as scratch:
        built = Path(scratch, ffibuilder.compile(tmpdir=scratch))
        shutil.copy(built, Path(__file__).with_name(built.name))
