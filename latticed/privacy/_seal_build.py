"""Build script of the optional compiled batch sealer, ``latticed.privacy._sealbatch`` (cffi API mode).

Why it exists: sealing a batch from Python costs one libsodium call per record through cffi (~0.66 us of
argument conversion and GIL release each) plus the Python that builds each envelope; this seals a whole
batch, or opens one, in one call with the GIL released. The envelopes are byte for byte those of the
pure-Python path in :mod:`latticed.privacy.crypto`, which stays the fallback when this is not built.

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
                        unsigned char *out, size_t out_size, uint64_t *bounds);
long latticed_open_batch(uintptr_t decrypt, const unsigned char *key, const unsigned char *ad,
                         size_t adlen, const unsigned char *envelopes, size_t envelopes_size,
                         const uint32_t *lengths, size_t n, unsigned char *out, size_t out_size);
"""

SOURCE = r"""
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

/* Envelope i = head | nonce i | AEAD(prefix | part i), one after the other in out; bounds[i] and
   bounds[i + 1] are where envelope i starts and ends in out (n + 1 entries). Each inner record is copied
   to its place and encrypted there: libsodium's XChaCha20-Poly1305 XORs the stream block by block and
   MACs the ciphertext after, so c == m is allowed. Returns 0; -1 if the sizes disagree or -3 if an inner
   record is over max_inner (both before anything is written); -2 if libsodium refused. */
int latticed_seal_batch(uintptr_t encrypt, const unsigned char *key, const unsigned char *ad, size_t adlen,
                        const unsigned char *head, const unsigned char *prefix, size_t prefix_len,
                        const unsigned char *parts, size_t parts_size, const uint32_t *lengths, size_t n,
                        size_t max_inner, const unsigned char *nonces, size_t nonces_size,
                        unsigned char *out, size_t out_size, uint64_t *bounds)
{
    aead_encrypt_fn seal = (aead_encrypt_fn) encrypt;
    size_t i, total = 0;
    for (i = 0; i < n; i++) {
        if (prefix_len + lengths[i] > max_inner) {
            return -3;
        }
        total += lengths[i];
    }
    if (total != parts_size || out_size != total + n * (OVERHEAD + prefix_len)
        || nonces_size != n * NONCE_SIZE) {
        return -1;
    }
    bounds[0] = 0;
    for (i = 0; i < n; i++) {
        size_t size = prefix_len + lengths[i];
        unsigned char *body = out + HEAD_SIZE + NONCE_SIZE;
        memcpy(out, head, HEAD_SIZE);
        memcpy(out + HEAD_SIZE, nonces, NONCE_SIZE);
        memcpy(body, prefix, prefix_len);
        memcpy(body + prefix_len, parts, lengths[i]);
        if (seal(body, NULL, body, size, ad, adlen, NULL, nonces, key) != 0) {
            return -2;
        }
        parts += lengths[i];
        nonces += NONCE_SIZE;
        out += OVERHEAD + size;
        bounds[i + 1] = bounds[i] + OVERHEAD + size;
    }
    return 0;
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
ffibuilder.set_source(MODULE, SOURCE)

if __name__ == "__main__":  # by hand: build in a scratch directory, keep only the module, next to this file
    import shutil
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as scratch:
        built = Path(scratch, ffibuilder.compile(tmpdir=scratch))
        shutil.copy(built, Path(__file__).with_name(built.name))
