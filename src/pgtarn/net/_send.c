/* pgtarn.net._send: send bytes on a non-blocking socket, keeping the GIL.
 *
 * A relayed message goes out through its transport's write(), which in uvloop costs about
 * 900 instructions before the system call: a buffer list appended to and cleared, a memory
 * view, flow-control checks. When the transport holds nothing unsent, send_some() makes the
 * same system call from here, for about 100. What it could not send, the caller gives to the
 * transport, which then owns the rest (see net/sending.py).
 *
 * The GIL is kept across send(2): the socket is non-blocking, the call copies into the
 * kernel's buffer and returns, and releasing the GIL would cost more than the call.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/types.h>

/* send_some(fd, data): how many bytes of data the socket fd took now, 0 when it took none
 * (its buffer is full, or it failed: the transport, given the bytes, meets the same error
 * and reports it its own way). */
static PyObject *
send_some(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send_some(fd, data) takes two arguments");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "send_some: fd out of range");
        return NULL;
    }
    Py_buffer view;
    const char *start;
    Py_ssize_t length;
    int viewed = 0;
    if (PyBytes_CheckExact(args[1])) {
        start = PyBytes_AS_STRING(args[1]);
        length = PyBytes_GET_SIZE(args[1]);
    } else {
        if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
            return NULL;
        }
        viewed = 1;
        start = view.buf;
        length = view.len;
    }
    ssize_t sent = 0;
    if (length > 0) {
        do {
            /* MSG_NOSIGNAL: a peer gone is an EPIPE to report, not a signal */
            sent = send((int)fd, start, (size_t)length, MSG_NOSIGNAL);
        } while (sent < 0 && errno == EINTR);
    }
    if (viewed) {
        PyBuffer_Release(&view);
    }
    return PyLong_FromSsize_t(sent < 0 ? 0 : sent);
}

static PyMethodDef send_methods[] = {
    {"send_some", (PyCFunction)(void (*)(void))send_some, METH_FASTCALL,
     "send_some(fd, data) -> int: the bytes of data a non-blocking socket took now (0 when "
     "none: full or failed)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef send_module = {
    PyModuleDef_HEAD_INIT, "_send",
    "Send bytes on a non-blocking socket, keeping the GIL.", -1, send_methods,
};

PyMODINIT_FUNC
PyInit__send(void)
{
    return PyModule_Create(&send_module);
}
