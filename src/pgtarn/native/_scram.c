/* pgtarn.native._scram: a SCRAM-SHA-256 login's two messages read and answered, in C.
 *
 * auth/scram.py owns the exchange (its states, its messages, every error), and asks this
 * module for the work of the usual messages:
 *
 * - server_first: read the usual client-first-message (the GS2 header the caller expects,
 *   "n=<name>,r=<nonce>") and make the server-first-message, the AuthMessage's start, the
 *   channel-binding input and the client-final-message expected
 *   (about 8,300 instructions per login as compiled Python: strings split, sliced, joined);
 * - server_final: compare the client-final-message with the one expected, decode the proof,
 *   compute ClientSignature, recover ClientKey, compare its hash with StoredKey in constant
 *   time and build the server-final-message with ServerSignature (45,000 instructions per
 *   login through hashlib and hmac, most of them the calls around each copy, update and
 *   digest of a hash state and the Python objects they make).
 *
 * server_nonce makes the server's nonce from getrandom(2) without os.urandom's and
 * binascii's calls around it.
 *
 * Anything but the usual message gives None: the Python code then reads the message itself
 * and says what is wrong, so both paths give the same errors.
 *
 * SHA-256 is OpenSSL's (libcrypto, which Python's hashlib and ssl load anyway), called
 * below EVP; HMAC (RFC 2104) is computed from the hash states after the padded keys, made
 * once per verifier (hmac_keys). Measured under callgrind, a SHA-256 block costs 2,100
 * instructions there against 4,000 in a portable C one written from FIPS 180-4 (3,300 with
 * BMI2), and a login hashes nine blocks; setup.py leaves this module out, and the Python
 * code does the work, where the OpenSSL headers are missing.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>

/* SHA256_Init, _Update and _Final are deprecated in OpenSSL 3 in favour of EVP, whose calls
 * around each hash (a context allocated, a provider's method looked up) cost as much as the
 * hash itself here; these are the hash alone, on a state a struct copy duplicates. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#define KEY_LEN 32
#define BLOCK 64
#define PROOF_B64 44 /* base64 of 32 bytes: 43 characters and one "=" */
#define MAX_MESSAGE 8192 /* auth/scram.py's MAX_MESSAGE: a longer one is its error */
#define CBIND_MAX 256 /* a channel-binding input longer than this is left to Python */
#define NONCE_BYTES 18 /* auth/scram.py's _NONCE_BYTES */
#define NONCE_B64 24

/* What hmac_keys returns and server_final reads: StoredKey, then the hash states after the
 * inner and outer padded keys of StoredKey and of ServerKey (plain structs, copied). */
typedef struct {
    unsigned char stored_key[KEY_LEN];
    SHA256_CTX stored_inner, stored_outer, server_inner, server_outer;
} hmac_keys_t;

/* RFC 2104: the states after the key's inner (0x36) and outer (0x5C) pads. */
static void
key_pads(const unsigned char key[KEY_LEN], SHA256_CTX *inner, SHA256_CTX *outer)
{
    unsigned char pad[BLOCK];
    for (int i = 0; i < BLOCK; i++) {
        pad[i] = (unsigned char)((i < KEY_LEN ? key[i] : 0) ^ 0x36);
    }
    SHA256_Init(inner);
    SHA256_Update(inner, pad, BLOCK);
    for (int i = 0; i < BLOCK; i++) {
        pad[i] ^= 0x36 ^ 0x5C;
    }
    SHA256_Init(outer);
    SHA256_Update(outer, pad, BLOCK);
}

/* HMAC-SHA-256 of the two parts a and b, one after the other, from a key's pad states. */
static void
hmac2(const SHA256_CTX *inner, const SHA256_CTX *outer, const unsigned char *a,
      size_t a_size, const unsigned char *b, size_t b_size, unsigned char out[KEY_LEN])
{
    SHA256_CTX s = *inner;
    SHA256_Update(&s, a, a_size);
    SHA256_Update(&s, b, b_size);
    SHA256_Final(out, &s);
    s = *outer;
    SHA256_Update(&s, out, KEY_LEN);
    SHA256_Final(out, &s);
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The value of a base64 character, or -1. */
static inline int
b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }
    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }
    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* 43 base64 characters and "=" into 32 bytes; 0 when they are not that. The last
 * character's two low bits are dropped unchecked, as binascii's strict mode drops them. */
static int
proof_decode(const unsigned char *text, unsigned char out[KEY_LEN])
{
    if (text[PROOF_B64 - 1] != '=') {
        return 0;
    }
    uint32_t bits = 0;
    int held = 0, o = 0;
    for (int i = 0; i < PROOF_B64 - 1; i++) {
        int v = b64_value(text[i]);
        if (v < 0) {
            return 0;
        }
        bits = bits << 6 | (uint32_t)v;
        held += 6;
        if (held >= 8) {
            held -= 8;
            out[o++] = (unsigned char)(bits >> held);
        }
    }
    return o == KEY_LEN;
}

/* Base64 of size bytes into out (4 characters for each 3 bytes or part of them). */
static void
b64_any(const unsigned char *in, Py_ssize_t size, char *out)
{
    for (Py_ssize_t i = 0; i < size; i += 3) {
        Py_ssize_t left = size - i;
        uint32_t v = (uint32_t)in[i] << 16 | (left > 1 ? (uint32_t)in[i + 1] << 8 : 0)
                     | (left > 2 ? in[i + 2] : 0);
        *out++ = B64[v >> 18];
        *out++ = B64[(v >> 12) & 63];
        *out++ = left > 1 ? B64[(v >> 6) & 63] : '=';
        *out++ = left > 2 ? B64[v & 63] : '=';
    }
}

/* A str's UTF-8 bytes (an ASCII str's own, no copy), or NULL with TypeError. */
static const char *
utf8_of(PyObject *text, Py_ssize_t *size, const char *what)
{
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "server_final: %s must be a str", what);
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(text, size);
}

static PyObject *
hmac_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[1])
        || PyBytes_GET_SIZE(args[0]) != KEY_LEN || PyBytes_GET_SIZE(args[1]) != KEY_LEN) {
        PyErr_SetString(PyExc_TypeError,
                        "hmac_keys(stored_key, server_key) takes two 32-byte bytes objects");
        return NULL;
    }
    hmac_keys_t keys;
    const unsigned char *stored = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    memcpy(keys.stored_key, stored, KEY_LEN);
    key_pads(stored, &keys.stored_inner, &keys.stored_outer);
    key_pads((const unsigned char *)PyBytes_AS_STRING(args[1]), &keys.server_inner,
             &keys.server_outer);
    return PyBytes_FromStringAndSize((const char *)&keys, sizeof keys);
}

static PyObject *
server_final(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyBytes_CheckExact(args[3])
        || PyBytes_GET_SIZE(args[3]) != (Py_ssize_t)sizeof(hmac_keys_t)) {
        PyErr_SetString(PyExc_TypeError,
                        "server_final(data, expected, prefix, keys) takes hmac_keys' keys");
        return NULL;
    }
    Py_ssize_t expected_size, prefix_size;
    const char *expected = utf8_of(args[1], &expected_size, "expected");
    if (expected == NULL) {
        return NULL;
    }
    const char *prefix = utf8_of(args[2], &prefix_size, "prefix");
    if (prefix == NULL) {
        return NULL;
    }
    PyObject *data = args[0];
    /* the usual message: the one expected, then ",p=" and the proof */
    if (!PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) > MAX_MESSAGE
        || PyBytes_GET_SIZE(data) != expected_size + 3 + PROOF_B64) {
        Py_RETURN_NONE;
    }
    const unsigned char *text = (const unsigned char *)PyBytes_AS_STRING(data);
    unsigned char proof[KEY_LEN];
    if (memcmp(text, expected, (size_t)expected_size) != 0
        || memcmp(text + expected_size, ",p=", 3) != 0
        || !proof_decode(text + expected_size + 3, proof)) {
        Py_RETURN_NONE;
    }
    hmac_keys_t keys;
    memcpy(&keys, PyBytes_AS_STRING(args[3]), sizeof keys);
    /* AuthMessage: the prefix (client-first-message-bare, server-first-message) and the
     * client-final-message without its proof */
    unsigned char client_key[KEY_LEN], stored[KEY_LEN];
    hmac2(&keys.stored_inner, &keys.stored_outer, (const unsigned char *)prefix,
          (size_t)prefix_size, text, (size_t)expected_size, client_key);
    for (int i = 0; i < KEY_LEN; i++) {
        client_key[i] ^= proof[i];
    }
    SHA256_CTX hash; /* (not SHA256(): in OpenSSL 3 that goes through EVP) */
    SHA256_Init(&hash);
    SHA256_Update(&hash, client_key, KEY_LEN);
    SHA256_Final(stored, &hash);
    /* constant time: the loop has no early exit */
    unsigned char differs = 0;
    for (int i = 0; i < KEY_LEN; i++) {
        differs |= (unsigned char)(stored[i] ^ keys.stored_key[i]);
    }
    char final[2 + PROOF_B64] = "v=";
    Py_ssize_t final_size = 0;
    if (!differs) {
        unsigned char signature[KEY_LEN];
        hmac2(&keys.server_inner, &keys.server_outer, (const unsigned char *)prefix,
              (size_t)prefix_size, text, (size_t)expected_size, signature);
        b64_any(signature, KEY_LEN, final + 2);
        final_size = sizeof final;
    }
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        return NULL;
    }
    PyObject *key = PyBytes_FromStringAndSize((const char *)client_key, KEY_LEN);
    PyTuple_SET_ITEM(pair, 0, key);
    PyObject *message = PyBytes_FromStringAndSize(final, final_size);
    PyTuple_SET_ITEM(pair, 1, message);
    if (key == NULL || message == NULL) {
        Py_DECREF(pair);
        return NULL;
    }
    return pair;
}

/* A new str of n ASCII parts, one after the other. */
static PyObject *
ascii_join(int n, const char *const *parts, const Py_ssize_t *sizes)
{
    Py_ssize_t total = 0;
    for (int i = 0; i < n; i++) {
        total += sizes[i];
    }
    PyObject *text = PyUnicode_New(total, 127);
    if (text == NULL) {
        return NULL;
    }
    char *out = (char *)PyUnicode_1BYTE_DATA(text);
    for (int i = 0; i < n; i++) {
        memcpy(out, parts[i], (size_t)sizes[i]);
        out += sizes[i];
    }
    return text;
}

static PyObject *
server_first(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyUnicode_Check(args[1]) || !PyUnicode_IS_ASCII(args[1])
        || !PyBytes_CheckExact(args[2]) || !PyUnicode_Check(args[3])
        || !PyUnicode_IS_ASCII(args[3]) || !PyUnicode_Check(args[4])
        || !PyUnicode_IS_ASCII(args[4])) {
        PyErr_SetString(PyExc_TypeError, "server_first(data, header, binding, server_nonce, "
                                         "tail) takes bytes, ASCII str, bytes, ASCII str");
        return NULL;
    }
    PyObject *data = args[0];
    if (!PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) > MAX_MESSAGE) {
        Py_RETURN_NONE;
    }
    const char *text = PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    const char *header = (const char *)PyUnicode_1BYTE_DATA(args[1]);
    Py_ssize_t header_size = PyUnicode_GET_LENGTH(args[1]);
    /* the usual message: the GS2 header the caller expects ("n,,", "y,," or -PLUS's), "n=",
     * a name of ASCII without ',', ",r=" and a printable nonce */
    if (header_size > CBIND_MAX || size < header_size
        || memcmp(text, header, (size_t)header_size) != 0) {
        Py_RETURN_NONE;
    }
    const char *bare = text + header_size;
    Py_ssize_t bare_size = size - header_size;
    if (bare_size < 2 || bare[0] != 'n' || bare[1] != '=') {
        Py_RETURN_NONE;
    }
    Py_ssize_t comma = 2;
    while (comma < bare_size && bare[comma] != ',') {
        if ((unsigned char)bare[comma] >= 0x80) {
            Py_RETURN_NONE; /* UTF-8 and its errors: the Python code's */
        }
        comma++;
    }
    if (comma + 3 > bare_size || bare[comma + 1] != 'r' || bare[comma + 2] != '=') {
        Py_RETURN_NONE;
    }
    const char *client_nonce = bare + comma + 3;
    Py_ssize_t client_nonce_size = bare_size - comma - 3;
    if (client_nonce_size == 0) {
        Py_RETURN_NONE;
    }
    for (Py_ssize_t i = 0; i < client_nonce_size; i++) {
        unsigned char c = (unsigned char)client_nonce[i];
        if (c < 0x21 || c > 0x7E || c == ',') {
            Py_RETURN_NONE;
        }
    }
    /* the channel-binding input: the header and the binding data (-PLUS's certificate
     * hash); its base64 starts the client-final-message */
    Py_ssize_t binding_size = PyBytes_GET_SIZE(args[2]);
    if (binding_size > CBIND_MAX - header_size) {
        Py_RETURN_NONE;
    }
    unsigned char cbind[CBIND_MAX];
    memcpy(cbind, header, (size_t)header_size);
    memcpy(cbind + header_size, PyBytes_AS_STRING(args[2]), (size_t)binding_size);
    Py_ssize_t cbind_size = header_size + binding_size;
    char channel[2 + (CBIND_MAX + 2) / 3 * 4 + 3] = "c=";
    b64_any(cbind, cbind_size, channel + 2);
    Py_ssize_t channel_size = 2 + (cbind_size + 2) / 3 * 4;
    memcpy(channel + channel_size, ",r=", 3);
    channel_size += 3;
    Py_ssize_t server_nonce_size = PyUnicode_GET_LENGTH(args[3]);
    const char *server_nonce = (const char *)PyUnicode_1BYTE_DATA(args[3]);
    Py_ssize_t tail_size = PyUnicode_GET_LENGTH(args[4]);
    const char *tail = (const char *)PyUnicode_1BYTE_DATA(args[4]);
    const char *nonce_parts[] = {client_nonce, server_nonce};
    const Py_ssize_t nonce_sizes[] = {client_nonce_size, server_nonce_size};
    PyObject *nonce = ascii_join(2, nonce_parts, nonce_sizes);
    /* AuthMessage's start: client-first-message-bare, server-first-message and commas */
    const char *prefix_parts[] = {bare, ",r=", client_nonce, server_nonce, tail, ","};
    const Py_ssize_t prefix_sizes[] = {bare_size, 3, client_nonce_size, server_nonce_size,
                                       tail_size, 1};
    PyObject *prefix = ascii_join(6, prefix_parts, prefix_sizes);
    const char *expected_parts[] = {channel, client_nonce, server_nonce};
    const Py_ssize_t expected_sizes[] = {channel_size, client_nonce_size, server_nonce_size};
    PyObject *expected = ascii_join(3, expected_parts, expected_sizes);
    /* the server-first-message: the prefix's part after the bare message and its comma */
    PyObject *reply = prefix == NULL ? NULL
                                     : PyBytes_FromStringAndSize(
                                         (const char *)PyUnicode_1BYTE_DATA(prefix) + bare_size
                                             + 1,
                                         PyUnicode_GET_LENGTH(prefix) - bare_size - 2);
    PyObject *cbind_input = PyBytes_FromStringAndSize((const char *)cbind, cbind_size);
    PyObject *five = PyTuple_New(5);
    if (nonce == NULL || prefix == NULL || expected == NULL || reply == NULL
        || cbind_input == NULL || five == NULL) {
        Py_XDECREF(nonce);
        Py_XDECREF(prefix);
        Py_XDECREF(expected);
        Py_XDECREF(reply);
        Py_XDECREF(cbind_input);
        Py_XDECREF(five);
        return NULL;
    }
    PyTuple_SET_ITEM(five, 0, nonce);
    PyTuple_SET_ITEM(five, 1, prefix);
    PyTuple_SET_ITEM(five, 2, expected);
    PyTuple_SET_ITEM(five, 3, reply);
    PyTuple_SET_ITEM(five, 4, cbind_input);
    return five;
}

/* A server nonce: 18 random bytes from getrandom(2) as 24 base64 characters; None when
 * getrandom fails (an old kernel, seccomp), for the Python code's os.urandom. */
static PyObject *
server_nonce(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "server_nonce() takes no arguments");
        return NULL;
    }
    unsigned char raw[NONCE_BYTES];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            Py_RETURN_NONE;
        }
        got += (size_t)n;
    }
    PyObject *nonce = PyUnicode_New(NONCE_B64, 127);
    if (nonce == NULL) {
        return NULL;
    }
    b64_any(raw, NONCE_BYTES, (char *)PyUnicode_1BYTE_DATA(nonce));
    return nonce;
}

static PyMethodDef scram_methods[] = {
    {"hmac_keys", (PyCFunction)(void (*)(void))hmac_keys, METH_FASTCALL,
     "hmac_keys(stored_key, server_key) -> bytes: what server_final needs of a verifier."},
    {"server_nonce", (PyCFunction)(void (*)(void))server_nonce, METH_FASTCALL,
     "server_nonce() -> str: 18 random bytes in base64; None when getrandom(2) fails."},
    {"server_first", (PyCFunction)(void (*)(void))server_first, METH_FASTCALL,
     "server_first(data, header, binding, server_nonce, tail) -> (nonce, AuthMessage's "
     "start, the client-final-message expected without its proof, server-first-message, "
     "channel-binding input); None when data is not header + \"n=<name>,r=<nonce>\"."},
    {"server_final", (PyCFunction)(void (*)(void))server_final, METH_FASTCALL,
     "server_final(data, expected, prefix, keys) -> (ClientKey, server-final-message), the "
     "message b\"\" when the proof is wrong; None when data is not expected + \",p=\" + a "
     "proof."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef scram_module = {
    PyModuleDef_HEAD_INIT, "_scram",
    "The server's check of a SCRAM-SHA-256 client-final-message.", -1, scram_methods,
};

PyMODINIT_FUNC
PyInit__scram(void)
{
    return PyModule_Create(&scram_module);
}
