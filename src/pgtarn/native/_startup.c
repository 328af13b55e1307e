/* pgtarn.native._startup: a StartupMessage's parameters read, and a welcome's end made, in C.
 *
 * Each login starts with a StartupMessage: protocol 3.0, then name and value pairs as
 * NUL-terminated UTF-8 strings, then an empty name. proto/messages.py reads it as compiled
 * Python in about 9,400 instructions (a split into bytes objects, a cache lookup and a decode
 * per string, the calls around each); here a short text seen lately is found by its bytes,
 * and any other is decoded where it lies and looked up in the cache of texts once.
 *
 * Only that usual message is read here: any other (another code, a string not terminated,
 * invalid UTF-8) gives None, and the Python code reads it and says what is wrong, so both
 * paths give the same errors.
 *
 * A welcome ends the same way for every client but for its key: welcome_end writes that end
 * after the ParameterStatus messages in one copy, where bytes concatenation made three and
 * the key's Struct.pack is a method call.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define PROTOCOL_3_0 0x00030000u

static PyObject *texts_copy(PyObject *texts, Py_ssize_t most, const char *start,
                            Py_ssize_t size);

/* The short ASCII texts seen last, by a hash of their bytes: a pool's clients send the same
 * few names and values, so a text seen before is found by a compare of its bytes, with no
 * decode, no new object and no dict lookup. Bounded: RECENT slots of at most RECENT_SIZE
 * bytes each. */
#define RECENT 64
#define RECENT_SIZE 64
static PyObject *recent[RECENT];

static size_t
recent_slot(const char *start, Py_ssize_t size)
{
    uint32_t hash = 2166136261u; /* FNV-1a */
    for (Py_ssize_t i = 0; i < size; i++) {
        hash = (hash ^ (unsigned char)start[i]) * 16777619u;
    }
    return (hash ^ (hash >> 16)) % RECENT;
}

/* The one copy of text in texts (its first, or text itself, added), as a new reference;
 * texts is emptied first when it holds `most` already, so that it stays bounded. */
static PyObject *
one_copy(PyObject *texts, Py_ssize_t most, const char *start, Py_ssize_t size)
{
    size_t slot = RECENT;
    if (size <= RECENT_SIZE) {
        slot = recent_slot(start, size);
        PyObject *seen = recent[slot];
        if (seen != NULL && PyUnicode_GET_LENGTH(seen) == size &&
            memcmp(PyUnicode_1BYTE_DATA(seen), start, (size_t)size) == 0) {
            Py_INCREF(seen);
            return seen;
        }
    }
    PyObject *text = texts_copy(texts, most, start, size);
    if (text != NULL && slot < RECENT && PyUnicode_IS_ASCII(text)) {
        Py_INCREF(text);
        Py_XSETREF(recent[slot], text);
    }
    return text;
}

/* one_copy through texts alone. */
static PyObject *
texts_copy(PyObject *texts, Py_ssize_t most, const char *start, Py_ssize_t size)
{
    PyObject *text = PyUnicode_DecodeUTF8(start, size, NULL);
    if (text == NULL) {
        return NULL;
    }
    PyObject *known = PyDict_GetItemWithError(texts, text);
    if (known != NULL) {
        Py_INCREF(known);
        Py_DECREF(text);
        return known;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(text);
        return NULL;
    }
    if (PyDict_GET_SIZE(texts) >= most) {
        PyDict_Clear(texts);
    }
    if (PyDict_SetItem(texts, text, text) < 0) {
        Py_DECREF(text);
        return NULL;
    }
    return text;
}

static PyObject *
startup_params(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_CheckExact(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "startup_params(body, texts, most) takes a dict, an int");
        return NULL;
    }
    Py_ssize_t most = PyLong_AsSsize_t(args[2]);
    if (most == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *body = args[0];
    if (!PyBytes_CheckExact(body) || PyBytes_GET_SIZE(body) < 4) {
        Py_RETURN_NONE;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(body);
    const unsigned char *end = p + PyBytes_GET_SIZE(body);
    uint32_t code = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    if (code != PROTOCOL_3_0) {
        Py_RETURN_NONE;
    }
    p += 4;
    PyObject *params = PyDict_New();
    if (params == NULL) {
        return NULL;
    }
    for (;;) {
        const unsigned char *name_end = p < end ? memchr(p, 0, (size_t)(end - p)) : NULL;
        if (name_end == NULL) {
            goto unusual; /* not terminated */
        }
        if (name_end == p) {
            return params; /* the empty name that ends the list (what follows is ignored) */
        }
        const unsigned char *value = name_end + 1;
        const unsigned char *value_end =
            value < end ? memchr(value, 0, (size_t)(end - value)) : NULL;
        if (value_end == NULL) {
            goto unusual;
        }
        PyObject *name = one_copy(args[1], most, (const char *)p, name_end - p);
        if (name == NULL) {
            goto failed;
        }
        PyObject *text = one_copy(args[1], most, (const char *)value, value_end - value);
        if (text == NULL) {
            Py_DECREF(name);
            goto failed;
        }
        int set = PyDict_SetItem(params, name, text);
        Py_DECREF(name);
        Py_DECREF(text);
        if (set < 0) {
            Py_DECREF(params);
            return NULL;
        }
        p = value_end + 1;
    }
failed:
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        Py_DECREF(params);
        return NULL;
    }
    PyErr_Clear(); /* invalid UTF-8: the Python code says so */
unusual:
    Py_DECREF(params);
    Py_RETURN_NONE;
}

/* welcome_end(statuses, pid, secret): statuses, then BackendKeyData for (pid, secret), then
 * ReadyForQuery idle, in one new bytes object: the last of a login's welcome. */
static PyObject *
welcome_end(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyBytes_CheckExact(args[0]) || !PyLong_Check(args[1]) ||
        !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "welcome_end(statuses, pid, secret) takes bytes, ints");
        return NULL;
    }
    unsigned long pid = PyLong_AsUnsignedLong(args[1]);
    if (pid == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    unsigned long secret = PyLong_AsUnsignedLong(args[2]);
    if (secret == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (pid > 0xFFFFFFFFul || secret > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_OverflowError, "a BackendKeyData field is 32 bits");
        return NULL;
    }
    static const unsigned char ready_idle[6] = {'Z', 0, 0, 0, 5, 'I'};
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    PyObject *made = PyBytes_FromStringAndSize(NULL, size + 13 + 6);
    if (made == NULL) {
        return NULL;
    }
    unsigned char *at = (unsigned char *)PyBytes_AS_STRING(made);
    memcpy(at, PyBytes_AS_STRING(args[0]), (size_t)size);
    at += size;
    const unsigned char key_head[5] = {'K', 0, 0, 0, 12};
    memcpy(at, key_head, 5);
    at += 5;
    const unsigned long fields[2] = {pid, secret};
    for (int i = 0; i < 2; i++) {
        *at++ = (unsigned char)(fields[i] >> 24);
        *at++ = (unsigned char)(fields[i] >> 16);
        *at++ = (unsigned char)(fields[i] >> 8);
        *at++ = (unsigned char)fields[i];
    }
    memcpy(at, ready_idle, 6);
    return made;
}

static PyMethodDef startup_methods[] = {
    {"startup_params", (PyCFunction)(void (*)(void))startup_params, METH_FASTCALL,
     "startup_params(body, texts, most) -> dict: a protocol 3.0 StartupMessage's parameters, "
     "each text the one copy in texts; None for any other message."},
    {"welcome_end", (PyCFunction)(void (*)(void))welcome_end, METH_FASTCALL,
     "welcome_end(statuses, pid, secret) -> bytes: statuses, BackendKeyData and "
     "ReadyForQuery idle."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef startup_module = {
    PyModuleDef_HEAD_INIT, "_startup",
    "A StartupMessage's parameters read, and a welcome's end made, in C.", -1,
    startup_methods,
};

PyMODINIT_FUNC
PyInit__startup(void)
{
    return PyModule_Create(&startup_module);
}
