/* pgtarn.native._shape: a query's shape, its text with every digit made a zero, in C.
 *
 * The relay asks what each Query and Parse may do (session/effects.py: first_look) and
 * caches the answer by the body's shape, since digits never decide it. bytes.translate
 * makes that shape in 8 instructions a byte and allocates it for every message; a busy pool
 * sees the same shape again and again, so this compares the body with the last shape first,
 * 16 bytes at a time (the loops have no early exit, so the compiler vectorises them), and
 * allocates only for a shape not seen last.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* c, or '0' for the digits '1' to '9'. */
static inline unsigned char
zeroed(unsigned char c)
{
    return (unsigned char)(c - '1') < 9 ? (unsigned char)'0' : c;
}

static PyObject *
shape_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "shape_of(text, last) takes two bytes objects");
        return NULL;
    }
    const unsigned char *text = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    if (PyBytes_GET_SIZE(args[1]) == size) {
        const unsigned char *last = (const unsigned char *)PyBytes_AS_STRING(args[1]);
        unsigned char differs = 0;
        for (Py_ssize_t i = 0; i < size; i++) {
            differs |= (unsigned char)(zeroed(text[i]) ^ last[i]);
        }
        if (!differs) {
            Py_INCREF(args[1]);
            return args[1];
        }
    }
    PyObject *shape = PyBytes_FromStringAndSize(NULL, size);
    if (shape == NULL) {
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(shape);
    for (Py_ssize_t i = 0; i < size; i++) {
        out[i] = zeroed(text[i]);
    }
    return shape;
}

static PyMethodDef shape_methods[] = {
    {"shape_of", (PyCFunction)(void (*)(void))shape_of, METH_FASTCALL,
     "shape_of(text, last) -> bytes: text with every digit made a zero; last itself when "
     "that is last."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef shape_module = {
    PyModuleDef_HEAD_INIT, "_shape", "A query's shape: its text with every digit made a zero.",
    -1, shape_methods,
};

PyMODINIT_FUNC
PyInit__shape(void)
{
    return PyModule_Create(&shape_module);
}
