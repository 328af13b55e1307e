/* pgtarn.net._io: accept, receive and send on non-blocking sockets, keeping the GIL.
 *
 * uvloop hands a read to Python through two callbacks that each take the GIL back (one to
 * allocate the buffer, one to deliver the bytes), and a transport's write() costs about 900
 * instructions before the system call. A socket of pgtarn's own (net/transport.py) is
 * watched with the loop's add_reader, one callback per read, and reads and writes with
 * these functions: each is the system call and the bytes object, about 100 instructions.
 *
 * The GIL is kept across the system call: the socket is non-blocking, the call copies to or
 * from the kernel's buffer and returns, and releasing the GIL would cost more than the call.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

/* The largest read: uvloop's (and asyncio's) read size. Static, since the GIL is held. */
#define READ_SIZE 65536
static char read_buffer[READ_SIZE];

static int
fd_of(PyObject *arg, int *fd)
{
    long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (value < 0 || value > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "fd out of range");
        return -1;
    }
    *fd = (int)value;
    return 0;
}

/* Send what a socket takes now; -1 and errno set when it failed (EAGAIN: it is full). */
static int
send_now(PyObject *const *args, Py_ssize_t nargs, const char *name, ssize_t *sent)
{
    int fd;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(fd, data) takes two arguments", name);
        return -1;
    }
    if (fd_of(args[0], &fd) < 0) {
        return -1;
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
            return -1;
        }
        viewed = 1;
        start = view.buf;
        length = view.len;
    }
    *sent = 0;
    if (length > 0) {
        do {
            /* MSG_NOSIGNAL: a peer gone is an EPIPE to report, not a signal */
            *sent = send(fd, start, (size_t)length, MSG_NOSIGNAL);
        } while (*sent < 0 && errno == EINTR);
    }
    if (viewed) {
        int saved = errno;
        PyBuffer_Release(&view);
        errno = saved;
    }
    return 0;
}

/* send_some(fd, data): how many bytes of data the socket fd took now, 0 when it took none
 * (its buffer is full, or it failed: the transport, given the bytes, meets the same error
 * and reports it its own way). */
static PyObject *
send_some(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    ssize_t sent;
    if (send_now(args, nargs, "send_some", &sent) < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(sent < 0 ? 0 : sent);
}

/* send_part(fd, data): how many bytes of data the socket took now, 0 when it is full;
 * OSError when it failed. */
static PyObject *
send_part(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    ssize_t sent;
    if (send_now(args, nargs, "send_part", &sent) < 0) {
        return NULL;
    }
    if (sent < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return PyLong_FromLong(0);
        }
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(sent);
}

/* recv_some(fd): the bytes the socket holds now (at most READ_SIZE), b"" at the end of the
 * stream, None when it holds none; OSError when it failed. */
static PyObject *
recv_some(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    int fd;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "recv_some(fd) takes one argument");
        return NULL;
    }
    if (fd_of(args[0], &fd) < 0) {
        return NULL;
    }
    ssize_t got;
    do {
        got = recv(fd, read_buffer, READ_SIZE, 0);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            Py_RETURN_NONE;
        }
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBytes_FromStringAndSize(read_buffer, got);
}

/* The peer address accept(2) gave, as Python's socket module has it: (host, port) for IPv4,
 * (host, port, flowinfo, scope_id) for IPv6, "" for a unix socket's (unnamed) peer. */
static PyObject *
address_of(const struct sockaddr_storage *address)
{
    char host[INET6_ADDRSTRLEN];
    if (address->ss_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)address;
        if (inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host) == NULL) {
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        return Py_BuildValue("(si)", host, (int)ntohs(v4->sin_port));
    }
    if (address->ss_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)address;
        if (inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host) == NULL) {
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        return Py_BuildValue("(siII)", host, (int)ntohs(v6->sin6_port),
                             (unsigned int)ntohl(v6->sin6_flowinfo),
                             (unsigned int)v6->sin6_scope_id);
    }
    return PyUnicode_FromString("");
}

/* accept_some(fd): (the fd of a connection accepted on listening socket fd, non-blocking
 * and close-on-exec; its peer's address), None when none waits; OSError when it failed. */
static PyObject *
accept_some(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    int fd;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "accept_some(fd) takes one argument");
        return NULL;
    }
    if (fd_of(args[0], &fd) < 0) {
        return NULL;
    }
    struct sockaddr_storage address;
    socklen_t length;
    int accepted;
    do {
        length = sizeof address;
        accepted = accept4(fd, (struct sockaddr *)&address, &length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    } while (accepted < 0 && errno == EINTR);
    if (accepted < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            Py_RETURN_NONE;
        }
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *peer = address_of(&address);
    if (peer == NULL) {
        close(accepted);
        return NULL;
    }
    return Py_BuildValue("(iN)", accepted, peer);
}

static PyMethodDef io_methods[] = {
    {"send_some", (PyCFunction)(void (*)(void))send_some, METH_FASTCALL,
     "send_some(fd, data) -> int: the bytes of data a non-blocking socket took now (0 when "
     "none: full or failed)."},
    {"send_part", (PyCFunction)(void (*)(void))send_part, METH_FASTCALL,
     "send_part(fd, data) -> int: the bytes of data a non-blocking socket took now (0 when "
     "full); OSError when it failed."},
    {"recv_some", (PyCFunction)(void (*)(void))recv_some, METH_FASTCALL,
     "recv_some(fd) -> bytes | None: what a non-blocking socket holds now (b\"\" at its end, "
     "None when nothing); OSError when it failed."},
    {"accept_some", (PyCFunction)(void (*)(void))accept_some, METH_FASTCALL,
     "accept_some(fd) -> (int, address) | None: a connection accepted on a listening socket "
     "(non-blocking, close-on-exec) and its peer's address; None when none waits."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef io_module = {
    PyModuleDef_HEAD_INIT, "_io",
    "Accept, receive and send on non-blocking sockets, keeping the GIL.", -1, io_methods,
};

PyMODINIT_FUNC
PyInit__io(void)
{
    return PyModule_Create(&io_module);
}
