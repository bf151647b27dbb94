/* ckptio._memcopy: copy(dst, src), a large memory copy with non-temporal (streaming) stores.
 *
 * Why hand-written: an async save's snapshot copies the whole state into memory that is not
 * read again until the background writer sends it to storage. A plain copy makes the CPU
 * read every destination cache line before writing it (read-for-ownership): three memory
 * transfers per byte instead of two. glibc's memcpy switches to streaming stores only above
 * x86_non_temporal_threshold (3/4 of what it takes for the shared cache: 192 MiB on this
 * project's VM), numpy and torch copy through memcpy or plain vector stores, and no
 * maintained Python package offers the copy. The measurement behind the choice (this copy
 * against numpy.copyto and torch's copy_, side by side) is in docs/performance.md.
 *
 * The GIL is released during the copy, so several threads copy in parallel. Elsewhere than
 * x86-64 (where SSE2 is always there) this is memcpy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define CKPTIO_STREAMING 1
#else
#define CKPTIO_STREAMING 0
#endif

/* below this, the destination is likely to stay in cache and memcpy is as fast */
#define STREAM_MIN (256 * 1024)

static void stream_copy(char *d, const char *s, size_t n) {
#if CKPTIO_STREAMING
    if (n >= STREAM_MIN) {
        size_t head = (16 - ((uintptr_t)d & 15)) & 15; /* streaming stores need 16-byte alignment */
        memcpy(d, s, head);
        d += head, s += head, n -= head;
        size_t body = n & ~(size_t)63;
        for (size_t i = 0; i < body; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 16), b);
            _mm_stream_si128((__m128i *)(d + i + 32), c);
            _mm_stream_si128((__m128i *)(d + i + 48), e);
        }
        _mm_sfence(); /* order the streamed stores before anything this thread does next */
        d += body, s += body, n -= body;
    }
#endif
    memcpy(d, s, n);
}

static PyObject *copy(PyObject *self, PyObject *args) {
    Py_buffer dst, src;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*y*:copy", &dst, &src))
        return NULL;
    if (dst.len != src.len) {
        PyErr_Format(PyExc_ValueError, "copy: dst has %zd bytes, src %zd", dst.len, src.len);
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    stream_copy((char *)dst.buf, (const char *)src.buf, (size_t)dst.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy", copy, METH_VARARGS,
     "copy(dst, src): copy the bytes of contiguous buffer src into contiguous writable buffer "
     "dst of the same length (no overlap), with streaming stores for large copies; releases "
     "the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_memcopy", "Large memory copies with non-temporal stores.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__memcopy(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "STREAMING", CKPTIO_STREAMING) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
