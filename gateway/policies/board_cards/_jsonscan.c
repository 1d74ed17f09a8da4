/* gateway.policies.board_cards._jsonscan: one JSON array read in C, for json_splice (beside it).
 *
 * scan_array(body, pos, keep) reads the array whose '[' is at body[pos] and checks it strictly by the JSON grammar
 * (RFC 8259): strings closed, no raw control character in them, escape letters valid (\uXXXX with four hex
 * digits), numbers as the grammar writes them, true/false/null, commas and colons where they belong, brackets of
 * matching kinds. Like the exact path, it does not check UTF-8.
 *
 * It returns what json_splice._scan_array returns: (offset after the ']', number of elements, a list of the offsets
 * just after each of the first ``keep`` elements, offset just after the last element, or of the ']' when the array
 * is empty). It returns None when the text is not such an array or when it nests deeper than MAX_DEPTH: the caller
 * then reads the array by its exact path, which gives the answer (and the reason). So this module only ever
 * vouches for JSON; it never decides that a text is not JSON.
 *
 * Speed: strings are skipped 16 bytes at a time with SSE2 (every x86-64 has it; elsewhere a byte loop); the rest is
 * one pass of plain C, about 0.35 ns a byte on a 10 MB board. No object is made per element, only the ``keep``
 * offsets: memory does not grow with the array. The GIL is released while the buffer is read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

#define MAX_DEPTH 512 /* as json_splice._MAX_DEPTH: deeper values are left to the exact path */

/* 1 for the bytes a string cannot hold as they are: '"', '\\' and control characters. */
static unsigned char string_stop[256];
/* 1 for JSON whitespace. */
static unsigned char json_ws[256];
/* 1 for hex digits. */
static unsigned char hex_digit[256];

static void init_tables(void)
{
    for (int c = 0; c < 256; c++) {
        string_stop[c] = (c < 0x20 || c == '"' || c == '\\');
        json_ws[c] = (c == ' ' || c == '\t' || c == '\n' || c == '\r');
        hex_digit[c] = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    }
}

/* Every reader below relies on the byte at p[n] being NUL, as it is after the data of every bytes object: NUL is
 * not whitespace, not a digit, not any bracket or separator, and may not appear raw in a string, so each loop and
 * each single-byte test stops there (a failure) without a separate end check, and nothing past p[n] is ever read.
 * Only the 16-byte string steps and the literal comparisons check the length. */

static inline Py_ssize_t skip_ws(const unsigned char *p, Py_ssize_t i)
{
    if (p[i] > ' ')
        return i; /* the common case: no whitespace at all */
    while (json_ws[p[i]])
        i++;
    return i;
}

/* From just after an opening quote: the offset just after the closing quote, or -1. */
static inline __attribute__((always_inline)) Py_ssize_t skip_string(const unsigned char *p, Py_ssize_t i, Py_ssize_t n)
{
#ifdef HAVE_SSE2
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i backslash = _mm_set1_epi8('\\');
    const __m128i control = _mm_set1_epi8(0x1F);
#endif
    for (;;) {
#ifdef HAVE_SSE2
        while (i + 16 <= n) {
            __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
            __m128i stop = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                _mm_cmpeq_epi8(_mm_max_epu8(v, control), control)); /* max(v, 0x1F) == 0x1F: v <= 0x1F */
            int mask = _mm_movemask_epi8(stop);
            if (mask) {
                i += __builtin_ctz((unsigned)mask);
                goto found;
            }
            i += 16;
        }
#endif
        while (!string_stop[p[i]])
            i++;
#ifdef HAVE_SSE2
    found:
#endif
        if (p[i] == '"')
            return i + 1;
        if (p[i] != '\\')
            return -1; /* a raw control character, or the end of the text */
        switch (p[i + 1]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            i += 2;
            break;
        case 'u': /* each test stops at the first byte that is not a hex digit, at the latest the NUL at p[n] */
            if (!hex_digit[p[i + 2]] || !hex_digit[p[i + 3]] || !hex_digit[p[i + 4]] || !hex_digit[p[i + 5]])
                return -1;
            i += 6;
            break;
        default:
            return -1;
        }
    }
}

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* From the first byte of a number: the offset just after it, or -1. */
static inline Py_ssize_t skip_number(const unsigned char *p, Py_ssize_t i)
{
    if (p[i] == '-')
        i++;
    if (p[i] == '0')
        i++;
    else if (p[i] >= '1' && p[i] <= '9')
        while (is_digit(p[++i]))
            ;
    else
        return -1;
    if (p[i] == '.') {
        if (!is_digit(p[++i]))
            return -1;
        while (is_digit(p[++i]))
            ;
    }
    if ((p[i] | 0x20) == 'e') {
        if (p[++i] == '+' || p[i] == '-')
            i++;
        if (!is_digit(p[i]))
            return -1;
        while (is_digit(p[++i]))
            ;
    }
    return i;
}

static inline Py_ssize_t skip_word(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, const char *word,
                                   Py_ssize_t len)
{
    return (n - i >= len && memcmp(p + i, word, (size_t)len) == 0) ? i + len : -1;
}

/* One JSON value from its first byte (no whitespace before it): the offset just after it, or -1.
 * The branches are ordered for what cards hold most: strings, then small numbers, then containers; ``top`` keeps
 * the closing bracket of the innermost open container in a register. */
static Py_ssize_t skip_value(const unsigned char *p, Py_ssize_t i, Py_ssize_t n)
{
    unsigned char stack[MAX_DEPTH]; /* the closing bracket of each open container */
    int depth = 0;
    unsigned char c, top = 0;

value:
    c = p[i];
    if (c == '"') {
        i = skip_string(p, i + 1, n);
    } else if ((c >= '0' && c <= '9') || c == '-') {
        i = skip_number(p, i);
    } else if (c == '{' || c == '[') {
        if (depth == MAX_DEPTH)
            return -1;
        top = (unsigned char)(c + 2); /* '{' + 2 == '}', '[' + 2 == ']' */
        stack[depth++] = top;
        i = skip_ws(p, i + 1);
        if (p[i] == top) {
            i++;
            goto close;
        }
        if (c == '[')
            goto value;
        goto member;
    } else if (c == 't') {
        i = skip_word(p, i, n, "true", 4);
    } else if (c == 'f') {
        i = skip_word(p, i, n, "false", 5);
    } else if (c == 'n') {
        i = skip_word(p, i, n, "null", 4);
    } else {
        return -1; /* not a value, or the end of the text */
    }
    if (i < 0)
        return -1;

after: /* just after a value, inside the container that ``top`` closes */
    if (depth == 0)
        return i;
    c = p[i];
    if (c == ',' && top == '}' && p[i + 1] == '"') {
        i++; /* the common case in an object: the next member's name right after the comma */
        goto member;
    }
    if (c <= ' ') {
        i = skip_ws(p, i);
        c = p[i];
    }
    if (c == ',') {
        i = skip_ws(p, i + 1);
        if (top == ']')
            goto value;
        goto member;
    }
    if (c != top)
        return -1;
    i++;
close: /* just after a container's closing bracket */
    if (--depth > 0)
        top = stack[depth - 1];
    goto after;

member: /* at a member's name */
    if (p[i] != '"')
        return -1;
    i = skip_string(p, i + 1, n);
    if (i < 0)
        return -1;
    if (p[i] == ':') {
        i++;
    } else {
        i = skip_ws(p, i);
        if (p[i] != ':')
            return -1;
        i++;
    }
    i = skip_ws(p, i);
    goto value;
}

/* The array at p[pos]: its end offset, or -1. ``ends`` (``*cap`` slots, grown with PyMem_Raw*, usable without the
 * GIL) receives the ends of the first ``keep`` elements; ``*count`` the number of elements, ``*last_end`` the end of
 * the last one (of the ']' position when empty). -2: out of memory. */
static Py_ssize_t read_array(const unsigned char *p, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t keep, Py_ssize_t **ends,
                             Py_ssize_t *cap, Py_ssize_t *count, Py_ssize_t *last_end)
{
    Py_ssize_t i = skip_ws(p, pos + 1);
    *count = 0;
    *last_end = i;
    if (p[i] == ']')
        return i + 1;
    for (;;) {
        i = skip_value(p, i, n);
        if (i < 0)
            return -1;
        *last_end = i;
        if (*count < keep) {
            if (*count == *cap) {
                Py_ssize_t more = *cap ? *cap * 2 : 128;
                Py_ssize_t *grown = PyMem_RawRealloc(*ends, (size_t)more * sizeof(Py_ssize_t));
                if (grown == NULL)
                    return -2;
                *ends = grown;
                *cap = more;
            }
            (*ends)[*count] = i;
        }
        ++*count;
        i = skip_ws(p, i);
        if (p[i] == ',') {
            i = skip_ws(p, i + 1);
            continue;
        }
        if (p[i] == ']')
            return i + 1;
        return -1;
    }
}

static PyObject *scan_array(PyObject *self, PyObject *args)
{
    PyObject *body, *list = NULL, *result = NULL;
    Py_ssize_t pos, keep, count = 0, last_end = 0, cap = 0, end = -1;
    Py_ssize_t *ends = NULL;
    (void)self;
    /* bytes only ("S"): its data is followed by a NUL, which the readers above rely on, and it cannot change. */
    if (!PyArg_ParseTuple(args, "Snn:scan_array", &body, &pos, &keep))
        return NULL;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t n = PyBytes_GET_SIZE(body);
    if (pos >= 0 && pos < n && p[pos] == '[') {
        /* Only the bytes are read (the caller's reference keeps them alive), so other threads run meanwhile. */
        Py_BEGIN_ALLOW_THREADS
        end = read_array(p, n, pos, keep, &ends, &cap, &count, &last_end);
        Py_END_ALLOW_THREADS
    }
    if (end == -2) {
        PyErr_NoMemory();
        goto out;
    }
    if (end < 0) {
        result = Py_NewRef(Py_None);
        goto out;
    }
    Py_ssize_t kept = count < keep ? count : (keep > 0 ? keep : 0);
    list = PyList_New(kept);
    if (list == NULL)
        goto out;
    for (Py_ssize_t k = 0; k < kept; k++) {
        PyObject *item = PyLong_FromSsize_t(ends[k]);
        if (item == NULL)
            goto out;
        PyList_SET_ITEM(list, k, item);
    }
    result = Py_BuildValue("(nnOn)", end, count, list, last_end);
out:
    Py_XDECREF(list);
    PyMem_RawFree(ends);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_array", scan_array, METH_VARARGS,
     "scan_array(body, pos, keep) -> (end, count, ends, last_end) | None: the JSON array at body[pos], checked."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gateway.policies.board_cards._jsonscan", "One JSON array read in C, for gateway.json_splice.", -1, methods,
};

PyMODINIT_FUNC PyInit__jsonscan(void)
{
    init_tables();
    return PyModule_Create(&module);
}
