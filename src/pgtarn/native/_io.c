/* pgtarn.native._io: accept, receive and send on non-blocking sockets, and watch them, keeping
 * the GIL.
 *
 * uvloop hands a read to Python through two callbacks that each take the GIL back (one to
 * allocate the buffer, one to deliver the bytes), and a transport's write() costs about 900
 * instructions before the system call. The sockets of pgtarn's own transports
 * (net/transport.py) are in one epoll set of the loop's, which the loop watches: one
 * callback asks it which sockets are readable (watch_ready), and each is read and written
 * with these functions: each is the system call and the bytes object, about 100
 * instructions.
 *
 * The GIL is kept across the system calls: the sockets are non-blocking, epoll_wait is asked
 * not to wait, each call returns at once, and releasing the GIL would cost more than the call.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <sys/epoll.h>
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

/* The last IPv4 host accept_some named, and its text: a pooler's clients mostly come from a
 * few hosts, so a repeated one costs a reference, not a formatting (inet_ntop's sprintf). */
static uint32_t last_v4_host;
static PyObject *last_v4_text;

/* host (network order) as a dotted quad. */
static PyObject *
v4_text(uint32_t host)
{
    if (last_v4_text != NULL && host == last_v4_host) {
        Py_INCREF(last_v4_text);
        return last_v4_text;
    }
    const unsigned char *octets = (const unsigned char *)&host;
    char text[16];
    char *at = text;
    for (int i = 0; i < 4; i++) {
        unsigned int octet = octets[i];
        if (octet >= 100) {
            *at++ = (char)('0' + octet / 100);
        }
        if (octet >= 10) {
            *at++ = (char)('0' + octet / 10 % 10);
        }
        *at++ = (char)('0' + octet % 10);
        *at++ = '.';
    }
    PyObject *made = PyUnicode_FromStringAndSize(text, at - text - 1);
    if (made == NULL) {
        return NULL;
    }
    Py_XSETREF(last_v4_text, made);
    last_v4_host = host;
    Py_INCREF(made);
    return made;
}

/* A 2-tuple of first and second, taking both references; either may be NULL (its error
 * set), and then the other is let go. */
static PyObject *
pair_of(PyObject *first, PyObject *second)
{
    PyObject *pair = first != NULL && second != NULL ? PyTuple_New(2) : NULL;
    if (pair == NULL) {
        Py_XDECREF(first);
        Py_XDECREF(second);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, first);
    PyTuple_SET_ITEM(pair, 1, second);
    return pair;
}

/* The peer address accept(2) gave, as Python's socket module has it: (host, port) for IPv4,
 * (host, port, flowinfo, scope_id) for IPv6, "" for a unix socket's (unnamed) peer. */
static PyObject *
address_of(const struct sockaddr_storage *address)
{
    char host[INET6_ADDRSTRLEN];
    if (address->ss_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)address;
        PyObject *text = v4_text(v4->sin_addr.s_addr);
        if (text == NULL) {
            return NULL;
        }
        return pair_of(text, PyLong_FromLong((long)ntohs(v4->sin_port)));
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
    PyObject *result = pair_of(PyLong_FromLong(accepted), peer);
    if (result == NULL) {
        close(accepted);
    }
    return result;
}

/* The sockets of a loop's transports in one epoll set (net/transport.py's SocketWatch).
 *
 * Each socket is registered with its transport as the event's data, a borrowed reference:
 * the watch holds the transport (by fd) for as long as its socket is registered and takes
 * the socket out (EPOLL_CTL_DEL, which drops its pending events) before letting it go. So
 * whatever epoll_wait returns is alive, and watch_ready hands it out with a reference of its
 * own: no lookup by fd, and nothing made per event. A socket that failed or hung up is told
 * by a None before its transport; a readable one is only its transport. */

#define WATCH_BATCH 256
static struct epoll_event ready_events[WATCH_BATCH];

static PyObject *
watch_set(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int epfd, fd;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "watch_set(epfd, epoll, op, fd, events, transport) takes 6 arguments");
        return NULL;
    }
    if (fd_of(args[0], &epfd) < 0 || fd_of(args[3], &fd) < 0) {
        return NULL;
    }
    long op = PyLong_AsLong(args[2]);
    long events = PyLong_AsLong(args[4]);
    if ((op == -1 || events == -1) && PyErr_Occurred()) {
        return NULL;
    }
    struct epoll_event event;
    event.events = (uint32_t)events;
    event.data.ptr = args[5];
    if (epoll_ctl(epfd, (int)op, fd, &event) < 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *
watch_ready(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int epfd, count;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "watch_ready(epfd, epoll, transports) takes 3 arguments");
        return NULL;
    }
    if (fd_of(args[0], &epfd) < 0) {
        return NULL;
    }
    do {
        count = epoll_wait(epfd, ready_events, WATCH_BATCH, 0);
    } while (count < 0 && errno == EINTR);
    if (count < 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_ssize_t size = count;
    for (int i = 0; i < count; i++) {
        if (ready_events[i].events & (EPOLLERR | EPOLLHUP)) {
            size++;
        }
    }
    PyObject *ready = PyList_New(size);
    if (ready == NULL) {
        return NULL;
    }
    Py_ssize_t at = 0;
    for (int i = 0; i < count; i++) {
        PyObject *transport = (PyObject *)ready_events[i].data.ptr;
        if (ready_events[i].events & (EPOLLERR | EPOLLHUP)) {
            Py_INCREF(Py_None);
            PyList_SET_ITEM(ready, at++, Py_None);
        }
        Py_INCREF(transport);
        PyList_SET_ITEM(ready, at++, transport);
    }
    return ready;
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
    {"watch_set", (PyCFunction)(void (*)(void))watch_set, METH_FASTCALL,
     "watch_set(epfd, epoll, op, fd, events, transport): epoll_ctl(2) on the set epfd, with "
     "transport as the data; epoll and the others are the pure build's."},
    {"watch_ready", (PyCFunction)(void (*)(void))watch_ready, METH_FASTCALL,
     "watch_ready(epfd, epoll, transports) -> [transport, ...]: the transports of the set's "
     "ready sockets now, without waiting, each one that failed or hung up after a None; "
     "epoll and transports are the pure build's."},
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
