/* gateway.policies.board_cards._jsonscan: the layout of a JSON body, read in C as its pieces arrive, for json_splice.
 *
 * ``Scanner(keep, top_array=False)`` is fed the body piece by piece (``feed``) and says at the end (``finish``)
 * where everything is, or that it cannot vouch for the text. It reads the language of json_splice's exact path, no
 * more and no less:
 *
 * - the top level strictly: one object (or, with ``top_array``, one array), string names, ':' and ',' where they
 *   belong, scalars by the JSON grammar (numbers, true/false/null, strings), whitespace, nothing after it;
 * - each array that is a member's value (and the top-level array) element by element, strictly the same way,
 *   recording the end of each of its first ``keep`` elements; an array that breaks that grammar is read on as a
 *   nested value and reported as not read (json_splice only needs the one named ``cards``);
 * - nested values loosely, as the exact path does: strings closed, escape letters valid (\uXXXX with four hex
 *   digits), no raw control character in a string, no backslash outside one, brackets balanced with matching kinds;
 *   everything else there is not looked at.
 * Like the exact path it does not check UTF-8. A value nested deeper than MAX_LEVEL is not vouched for (the exact
 * path then gives the answer).
 *
 * How: the bytes are read in blocks of 64. Each block is classified with SIMD compares into bit masks (quotes,
 * backslashes, control characters, brackets); escapes and the inside of strings follow from them by bit arithmetic
 * (a string's inside is the prefix XOR of its unescaped quotes), so a string costs nothing per byte. Inside nested
 * values only the brackets outside strings are visited, one bit at a time; at the strict levels (the top object,
 * the element gaps of its arrays) the bytes are read one by one, a few per element. A piece's last bytes that do
 * not fill a block wait, copied, for the next piece: the state (inside a string, an escape split at the edge, the
 * open brackets, a number cut in two) carries over, so a piece may end anywhere.
 *
 * Memory: the members of the top level and the first ``keep`` ends of each array; nothing per element beyond that.
 * A feed of 1 MiB or more releases the GIL while it reads (a scanner refuses to be used by two threads at once).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define HAVE_X86 1
#endif

#define MAX_LEVEL 512 /* as json_splice._MAX_DEPTH: a value nested deeper is left to the exact path */
#define STACK_SIZE (MAX_LEVEL + 4)
#define RELEASE_GIL_FROM (1 << 20)

static unsigned char hex_digit[256];
static unsigned char escape_letter[256];

static void init_tables(void)
{
    for (int c = 0; c < 256; c++) {
        hex_digit[c] = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        escape_letter[c] = c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
                           c == 't' || c == 'u';
    }
}

/* Where the reading is at a strict level (the top-level object, or an array read element by element). Inside a
 * nested value (depth > strict_depth) the state is the one to resume when that value ends. */
enum {
    S_START,         /* before the top-level value: whitespace, then '{' ('[' with top_array) */
    S_FIRST_KEY,     /* just after the top-level '{': whitespace, a name or '}' */
    S_KEY,           /* after ',' in the top-level object: whitespace, a name */
    S_IN_KEY,        /* inside a name */
    S_COLON,         /* after a name: whitespace, ':' */
    S_VALUE,         /* after ':': whitespace, a value */
    S_AFTER_MEMBER,  /* after a member's value: whitespace, ',' or '}' */
    S_FIRST_ELEMENT, /* just after an array's '[': whitespace, an element or ']' */
    S_ELEMENT,       /* after ',' in an array: whitespace, an element */
    S_AFTER_ELEMENT, /* after an element: whitespace, ',' or ']' */
    S_IN_STRING,     /* inside a string value (a member's or an element) */
    S_IN_SCALAR,     /* inside a number or a literal */
    S_NESTED,        /* inside a member's value that is an array no longer read element by element */
    S_DONE,          /* after the top-level value: whitespace only */
};

/* Numbers, by the grammar: the state after each byte; ``accepting`` marks where a number may end. */
enum { N_NONE, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
static const unsigned char number_accepting[] = {0, 0, 1, 1, 0, 1, 0, 0, 1};

typedef struct {
    Py_ssize_t start, key_end, value_start, end;
    Py_ssize_t array; /* index in ``arrays`` when the value is an array, else -1 */
} Member;

typedef struct {
    Py_ssize_t count, last_end, end;
    int strict; /* read element by element to its end */
    Py_ssize_t *ends, n_ends, cap_ends;
} Array;

typedef struct {
    PyObject_HEAD
    Py_ssize_t keep;
    int top_array;
    int failed, finished, busy;
    /* the bytes */
    Py_ssize_t base; /* offset of the next block's first byte */
    unsigned char tail[64];
    int tail_len;
    /* strings and escapes across blocks */
    uint64_t in_string; /* all ones when a string goes on into the next block */
    int escape_carry;   /* the next block's first byte is an escaped one (its letter not checked yet) */
    int hex_pending;    /* hex digits of a \u escape that the next block must start with */
    /* structure */
    int state;
    int depth;        /* open brackets, the top-level value's included */
    int strict_depth; /* depth of the strict level being read (1, or 2 for a member's array) */
    int level_is_array;
    unsigned char stack[STACK_SIZE]; /* the closing bracket of each open container, by depth */
    /* a number or literal being read */
    int number;
    const char *literal; /* the letters still expected, or NULL */
    /* what was found */
    Member *members;
    Py_ssize_t n_members, cap_members;
    Array *arrays;
    Py_ssize_t n_arrays, cap_arrays;
} Scanner;

static inline uint64_t from_bit(int pos) { return pos >= 64 ? 0 : ~0ULL << pos; }

static inline uint64_t prefix_xor(uint64_t x)
{
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    return x;
}

static inline int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* --- what is found: members and arrays (PyMem_Raw*: usable without the GIL) ------------------------------------ */

static int grow(void **items, Py_ssize_t *cap, Py_ssize_t n, size_t size)
{
    if (n < *cap)
        return 0;
    Py_ssize_t more = *cap ? *cap * 2 : 16;
    void *grown = PyMem_RawRealloc(*items, (size_t)more * size);
    if (grown == NULL)
        return -1;
    *items = grown;
    *cap = more;
    return 0;
}

static int new_member(Scanner *s, Py_ssize_t start)
{
    if (grow((void **)&s->members, &s->cap_members, s->n_members, sizeof(Member)) < 0)
        return -1;
    Member *m = &s->members[s->n_members++];
    m->start = start;
    m->key_end = m->value_start = m->end = -1;
    m->array = -1;
    return 0;
}

static int new_array(Scanner *s)
{
    if (grow((void **)&s->arrays, &s->cap_arrays, s->n_arrays, sizeof(Array)) < 0)
        return -1;
    Array *a = &s->arrays[s->n_arrays++];
    memset(a, 0, sizeof(*a));
    a->strict = 1;
    return 0;
}

/* A value at the strict level ended just before ``end``. -2: out of memory. */
static inline int value_end(Scanner *s, Py_ssize_t end)
{
    if (s->level_is_array) {
        Array *a = &s->arrays[s->n_arrays - 1];
        a->count++;
        a->last_end = end;
        if (a->count <= s->keep) {
            if (grow((void **)&a->ends, &a->cap_ends, a->n_ends, sizeof(Py_ssize_t)) < 0)
                return -2;
            a->ends[a->n_ends++] = end;
        }
        s->state = S_AFTER_ELEMENT;
    } else {
        s->members[s->n_members - 1].end = end;
        s->state = S_AFTER_MEMBER;
    }
    return 0;
}

/* --- the strict levels, byte by byte --------------------------------------------------------------------------- */

/* A byte the grammar does not allow here. In a member's array read element by element, the array is marked as not
 * read and read on as a nested value (from the same byte); anywhere else the scanner cannot vouch. */
static inline int violation(Scanner *s)
{
    if (s->level_is_array && s->depth == 2) {
        s->arrays[s->n_arrays - 1].strict = 0;
        s->level_is_array = 0;
        s->strict_depth = 1;
        s->state = S_NESTED;
        return 0;
    }
    return -1;
}

/* A value starting with ``c`` at ``at``: 1 when it opened a nested value (read on by the bracket walk), 0 when it
 * goes on at the strict level, -1/-2 as elsewhere. */
static inline int value_start(Scanner *s, unsigned char c, Py_ssize_t at)
{
    if (!s->level_is_array)
        s->members[s->n_members - 1].value_start = at;
    if (c == '"') {
        s->state = S_IN_STRING;
        return 0;
    }
    if (c == '[' && s->depth == 1 && !s->level_is_array) {
        /* a member's array: read element by element */
        if (new_array(s) < 0)
            return -2;
        s->members[s->n_members - 1].array = s->n_arrays - 1;
        s->depth = s->strict_depth = 2;
        s->stack[2] = ']';
        s->level_is_array = 1;
        s->state = S_FIRST_ELEMENT;
        return 0;
    }
    if (c == '[' || c == '{') {
        s->stack[++s->depth] = (unsigned char)(c + 2); /* '[' + 2 == ']', '{' + 2 == '}' */
        return 1; /* depth - strict_depth == 1: within MAX_LEVEL */
    }
    s->literal = NULL;
    s->number = N_NONE;
    if (c == '-')
        s->number = N_MINUS;
    else if (c == '0')
        s->number = N_ZERO;
    else if (c >= '1' && c <= '9')
        s->number = N_INT;
    else if (c == 't')
        s->literal = "rue";
    else if (c == 'f')
        s->literal = "alse";
    else if (c == 'n')
        s->literal = "ull";
    else
        return violation(s) < 0 ? -1 : 2; /* 2: read on from this byte as a nested value */
    s->state = S_IN_SCALAR;
    return 0;
}

/* Whether ``c`` goes on with the number or literal being read. */
static inline int scalar_step(Scanner *s, unsigned char c)
{
    if (s->literal != NULL) {
        if (*s->literal != '\0' && c == (unsigned char)*s->literal) {
            s->literal++;
            return 1;
        }
        return 0;
    }
    int digit = c >= '0' && c <= '9';
    int next = N_NONE;
    switch (s->number) {
    case N_MINUS: next = c == '0' ? N_ZERO : digit ? N_INT : N_NONE; break;
    case N_ZERO: next = c == '.' ? N_DOT : (c | 0x20) == 'e' ? N_E : N_NONE; break;
    case N_INT: next = digit ? N_INT : c == '.' ? N_DOT : (c | 0x20) == 'e' ? N_E : N_NONE; break;
    case N_DOT: next = digit ? N_FRAC : N_NONE; break;
    case N_FRAC: next = digit ? N_FRAC : (c | 0x20) == 'e' ? N_E : N_NONE; break;
    case N_E: next = (c == '+' || c == '-') ? N_ESIGN : digit ? N_EXP : N_NONE; break;
    case N_ESIGN: next = digit ? N_EXP : N_NONE; break;
    case N_EXP: next = digit ? N_EXP : N_NONE; break;
    }
    if (next == N_NONE)
        return 0;
    s->number = next;
    return 1;
}

static inline int scalar_complete(const Scanner *s)
{
    return s->literal != NULL ? *s->literal == '\0' : number_accepting[s->number];
}

/* The strict level from bit ``*pos`` of the block; returns with *pos at the block's end, or where a nested value
 * begins (depth > strict_depth: the bracket walk goes on from there). -1: cannot vouch; -2: out of memory. */
static int strict(Scanner *s, const unsigned char *blk, int *pos_io, uint64_t closing_quotes)
{
    int pos = *pos_io, r;
    const Py_ssize_t base = s->base;
    while (pos < 64) {
        unsigned char c = blk[pos];
        switch (s->state) {
        case S_IN_KEY:
        case S_IN_STRING: {
            uint64_t m = closing_quotes & from_bit(pos);
            if (!m) {
                *pos_io = 64;
                return 0;
            }
            pos = __builtin_ctzll(m) + 1;
            if (s->state == S_IN_KEY) {
                s->members[s->n_members - 1].key_end = base + pos;
                s->state = S_COLON;
            } else if (value_end(s, base + pos) < 0) {
                return -2;
            }
            continue;
        }
        case S_IN_SCALAR:
            if (scalar_step(s, c)) {
                pos++;
                continue;
            }
            if (!scalar_complete(s)) {
                if (violation(s) < 0)
                    return -1;
                *pos_io = pos; /* read on as a nested value from this byte */
                return 0;
            }
            if (value_end(s, base + pos) < 0)
                return -2;
            continue; /* the same byte, after the value */
        default:
            break;
        }
        if (is_ws(c)) {
            pos++;
            continue;
        }
        switch (s->state) {
        case S_START:
            if (c == (s->top_array ? '[' : '{')) {
                s->depth = s->strict_depth = 1;
                s->stack[1] = (unsigned char)(c + 2);
                if (s->top_array) {
                    if (new_array(s) < 0)
                        return -2;
                    s->level_is_array = 1;
                    s->state = S_FIRST_ELEMENT;
                } else {
                    s->state = S_FIRST_KEY;
                }
                pos++;
                continue;
            }
            return -1;
        case S_FIRST_KEY:
        case S_KEY:
            if (c == '"') {
                if (new_member(s, base + pos) < 0)
                    return -2;
                s->state = S_IN_KEY;
                pos++;
                continue;
            }
            if (c == '}' && s->state == S_FIRST_KEY) {
                s->depth = s->strict_depth = 0;
                s->state = S_DONE;
                pos++;
                continue;
            }
            return -1;
        case S_COLON:
            if (c != ':')
                return -1;
            s->state = S_VALUE;
            pos++;
            continue;
        case S_FIRST_ELEMENT:
            if (c == ']') {
                s->arrays[s->n_arrays - 1].last_end = base + pos;
                goto close_array;
            }
            /* fall through */
        case S_ELEMENT:
        case S_VALUE:
            r = value_start(s, c, base + pos);
            if (r < 0)
                return r;
            if (r == 2) { /* not a value: the array is read on as a nested value, from this byte */
                *pos_io = pos;
                return 0;
            }
            pos++;
            if (r == 1) {
                *pos_io = pos;
                return 0;
            }
            continue;
        case S_AFTER_MEMBER:
            if (c == ',') {
                s->state = S_KEY;
                pos++;
                continue;
            }
            if (c == '}') {
                s->depth = s->strict_depth = 0;
                s->state = S_DONE;
                pos++;
                continue;
            }
            return -1;
        case S_AFTER_ELEMENT:
            if (c == ',') {
                s->state = S_ELEMENT;
                pos++;
                continue;
            }
            if (c == ']')
                goto close_array;
            if (violation(s) < 0)
                return -1;
            *pos_io = pos;
            return 0;
        default: /* S_DONE */
            return -1;
        }
    close_array:
        pos++;
        s->arrays[s->n_arrays - 1].end = base + pos;
        s->level_is_array = 0;
        if (--s->depth == 0) {
            s->strict_depth = 0;
            s->state = S_DONE;
        } else {
            s->strict_depth = 1;
            if (value_end(s, base + pos) < 0)
                return -2;
        }
    }
    *pos_io = pos;
    return 0;
}

/* --- one block ------------------------------------------------------------------------------------------------- */

typedef struct {
    uint64_t quote, backslash, control, bracket;
} Classes;

static inline void classify_bytes(const unsigned char *p, Classes *k)
{
    uint64_t q = 0, b = 0, c = 0, br = 0;
    for (int i = 0; i < 64; i++) {
        unsigned char x = p[i];
        q |= (uint64_t)(x == '"') << i;
        b |= (uint64_t)(x == '\\') << i;
        c |= (uint64_t)(x < 0x20) << i;
        br |= (uint64_t)((x | 0x20) == '{' || (x | 0x20) == '}') << i;
    }
    k->quote = q, k->backslash = b, k->control = c, k->bracket = br;
}

#ifdef HAVE_X86
/* The compared bytes, 32 of each: '"', '\\', 0x1F, 0x20, '{', '}'. ('[' | 0x20 == '{' and ']' | 0x20 == '}'; no
 * other byte folds onto either.) Read through a pointer the compiler cannot see into, so that they stay memory
 * operands of the compares: as known constants it would rebuild them in registers every block (the call in the
 * block loop clobbers vector registers). */
#define V_QUOTE 0
#define V_BACKSLASH 32
#define V_1F 64
#define V_20 96
#define V_OPEN 128
#define V_CLOSE 160
static unsigned char compared[192] __attribute__((aligned(32)));

static void init_compared(void)
{
    memset(compared + V_QUOTE, '"', 32);
    memset(compared + V_BACKSLASH, '\\', 32);
    memset(compared + V_1F, 0x1F, 32);
    memset(compared + V_20, 0x20, 32);
    memset(compared + V_OPEN, '{', 32);
    memset(compared + V_CLOSE, '}', 32);
}

static inline const unsigned char *opaque(const unsigned char *p)
{
    __asm__("" : "+r"(p));
    return p;
}

static inline void classify_sse2(const unsigned char *p, Classes *k)
{
    const unsigned char *t = opaque(compared);
    const __m128i quote = _mm_load_si128((const __m128i *)(t + V_QUOTE)),
                  backslash = _mm_load_si128((const __m128i *)(t + V_BACKSLASH)),
                  c1f = _mm_load_si128((const __m128i *)(t + V_1F)), x20 = _mm_load_si128((const __m128i *)(t + V_20)),
                  open = _mm_load_si128((const __m128i *)(t + V_OPEN)),
                  close = _mm_load_si128((const __m128i *)(t + V_CLOSE));
    uint64_t q = 0, b = 0, c = 0, br = 0;
    for (int j = 0; j < 4; j++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + 16 * j));
        __m128i folded = _mm_or_si128(v, x20);
        q |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, quote)) << (16 * j);
        b |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, backslash)) << (16 * j);
        c |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(v, c1f), c1f)) << (16 * j);
        br |= (uint64_t)(uint16_t)_mm_movemask_epi8(
                  _mm_or_si128(_mm_cmpeq_epi8(folded, open), _mm_cmpeq_epi8(folded, close)))
              << (16 * j);
    }
    k->quote = q, k->backslash = b, k->control = c, k->bracket = br;
}

__attribute__((target("avx2"))) static inline void classify_avx2(const unsigned char *p, Classes *k)
{
    const unsigned char *t = opaque(compared);
    const __m256i quote = _mm256_load_si256((const __m256i *)(t + V_QUOTE)),
                  backslash = _mm256_load_si256((const __m256i *)(t + V_BACKSLASH)),
                  c1f = _mm256_load_si256((const __m256i *)(t + V_1F)),
                  x20 = _mm256_load_si256((const __m256i *)(t + V_20)),
                  open = _mm256_load_si256((const __m256i *)(t + V_OPEN)),
                  close = _mm256_load_si256((const __m256i *)(t + V_CLOSE));
    __m256i lo = _mm256_loadu_si256((const __m256i *)p), hi = _mm256_loadu_si256((const __m256i *)(p + 32));
    __m256i flo = _mm256_or_si256(lo, x20), fhi = _mm256_or_si256(hi, x20);
#define MASK64(a, b) ((uint64_t)(uint32_t)_mm256_movemask_epi8(a) | (uint64_t)(uint32_t)_mm256_movemask_epi8(b) << 32)
    k->quote = MASK64(_mm256_cmpeq_epi8(lo, quote), _mm256_cmpeq_epi8(hi, quote));
    k->backslash = MASK64(_mm256_cmpeq_epi8(lo, backslash), _mm256_cmpeq_epi8(hi, backslash));
    k->control = MASK64(_mm256_cmpeq_epi8(_mm256_max_epu8(lo, c1f), c1f), _mm256_cmpeq_epi8(_mm256_max_epu8(hi, c1f), c1f));
    k->bracket = MASK64(_mm256_or_si256(_mm256_cmpeq_epi8(flo, open), _mm256_cmpeq_epi8(flo, close)),
                        _mm256_or_si256(_mm256_cmpeq_epi8(fhi, open), _mm256_cmpeq_epi8(fhi, close)));
#undef MASK64
}

/* The prefix XOR by one carry-less multiplication with all ones. */
__attribute__((target("pclmul"))) static inline uint64_t prefix_xor_clmul(uint64_t x)
{
    return (uint64_t)_mm_cvtsi128_si64(
        _mm_clmulepi64_si128(_mm_set_epi64x(0, (long long)x), _mm_set1_epi8((char)0xFF), 0));
}
#endif

/* An escape letter at bit ``at`` of the block (and, for \u, the hex digits after it, those in a later block left
 * pending). */
static inline int check_escape(Scanner *s, const unsigned char *blk, int at)
{
    unsigned char letter = blk[at];
    if (!escape_letter[letter])
        return -1;
    if (letter == 'u') {
        for (int j = at + 1; j <= at + 4; j++) {
            if (j >= 64) {
                s->hex_pending = at + 5 - j;
                break;
            }
            if (!hex_digit[blk[j]])
                return -1;
        }
    }
    return 0;
}

/* The bytes of the block that backslashes escape (each backslash not itself escaped escapes the byte after it; one
 * outside a string makes the text fail in ``structure``, whatever it was taken for here), their letters checked.
 * Sets *fail when an escape is not valid. */
static inline uint64_t escapes(Scanner *s, const unsigned char *blk, uint64_t backslashes, int *fail)
{
    uint64_t starts = backslashes, escaped = 0;
    if (__builtin_expect(s->hex_pending | s->escape_carry, 0)) {
        for (int j = 0; j < s->hex_pending; j++)
            if (!hex_digit[blk[j]])
                *fail = 1;
        s->hex_pending = 0;
        if (s->escape_carry) {
            s->escape_carry = 0;
            escaped = 1;
            starts &= ~1ULL;
            if (check_escape(s, blk, 0) < 0)
                *fail = 1;
        }
    }
    while (starts) {
        int i = __builtin_ctzll(starts);
        if (i == 63) {
            s->escape_carry = 1;
            break;
        }
        escaped |= 1ULL << (i + 1);
        starts &= ~(3ULL << i);
        if (check_escape(s, blk, i + 1) < 0)
            *fail = 1;
    }
    return escaped;
}

/* The rest of one block, given where its strings are (``in_string``: from each opening quote to just before its
 * closing one). -1: cannot vouch; -2: out of memory. */
static inline int structure(Scanner *s, const unsigned char *blk, const Classes *k, uint64_t quotes,
                            uint64_t in_string)
{
    s->in_string = (uint64_t)((int64_t)in_string >> 63);
    if ((k->control & in_string) | (k->backslash & ~in_string))
        return -1;
    uint64_t brackets = k->bracket & ~in_string;
    uint64_t closing_quotes = quotes & ~in_string;

    int pos = 0;
    for (;;) {
        if (s->depth > s->strict_depth) {
            /* Inside a nested value: only its brackets matter. (Kept in locals: a store into the stack could alias
             * any field of the scanner.) */
            uint64_t m = brackets & from_bit(pos);
            int depth = s->depth;
            const int floor = s->strict_depth, ceiling = s->strict_depth + MAX_LEVEL;
            unsigned char *stack = s->stack;
            for (;;) {
                if (!m) {
                    s->depth = depth;
                    return 0;
                }
                int i = __builtin_ctzll(m);
                m &= m - 1;
                unsigned char c = blk[i];
                if (c & 2) { /* '[' or '{' */
                    if (++depth > ceiling)
                        return -1;
                    stack[depth] = (unsigned char)(c + 2);
                } else if (stack[depth] != c) {
                    return -1;
                } else if (--depth == floor) {
                    s->depth = depth;
                    pos = i + 1;
                    if (s->state == S_NESTED) {
                        /* the member's array that was not read element by element */
                        s->members[s->n_members - 1].end = s->base + pos;
                        s->state = S_AFTER_MEMBER;
                    } else if (value_end(s, s->base + pos) < 0) {
                        return -2;
                    }
                    break;
                }
            }
        }
        int r = strict(s, blk, &pos, closing_quotes);
        if (r < 0)
            return r;
        if (pos >= 64)
            return 0;
    }
}

/* Whether the whole block is inside one string with nothing to look at (the long strings of a board, its card
 * descriptions, are mostly such blocks). */
static inline int inside_string(const Scanner *s, const Classes *k)
{
    return s->in_string && !(k->quote | k->backslash | k->control) && !(s->hex_pending | s->escape_carry);
}

/* The whole blocks of ``p[0:n]`` (n a multiple of 64): the bytes classified by ``CLASSIFY``, the strings' inside by
 * ``PREFIX_XOR``. One function per instruction set. */
#define BLOCKS(CLASSIFY, PREFIX_XOR)                                                                                 \
    {                                                                                                          \
        Classes k;                                                                                             \
        for (Py_ssize_t i = 0; i < n; i += 64) {                                                               \
            CLASSIFY(p + i, &k);                                                                               \
            if (inside_string(s, &k)) {                                                                        \
                s->base += 64;                                                                                 \
                continue;                                                                                      \
            }                                                                                                  \
            int fail = 0;                                                                                      \
            uint64_t quotes = k.quote & ~escapes(s, p + i, k.backslash, &fail);                                \
            if (fail)                                                                                          \
                return -1;                                                                                     \
            int r = structure(s, p + i, &k, quotes, PREFIX_XOR(quotes) ^ s->in_string);                        \
            if (r < 0)                                                                                         \
                return r;                                                                                      \
            s->base += 64;                                                                                     \
        }                                                                                                      \
        return 0;                                                                                              \
    }

static int blocks_bytes(Scanner *s, const unsigned char *p, Py_ssize_t n) BLOCKS(classify_bytes, prefix_xor)

#ifdef HAVE_X86
static int blocks_sse2(Scanner *s, const unsigned char *p, Py_ssize_t n) BLOCKS(classify_sse2, prefix_xor)

__attribute__((target("avx2,pclmul"))) static int blocks_avx2(Scanner *s, const unsigned char *p, Py_ssize_t n)
    BLOCKS(classify_avx2, prefix_xor_clmul)
#endif

typedef int (*BlocksFn)(Scanner *, const unsigned char *, Py_ssize_t);
static BlocksFn blocks = blocks_bytes; /* the best the CPU has, chosen at import */

/* ``p[0:n]``: the waiting bytes completed to a block first, whole blocks read in place, the rest kept. */
static int feed_bytes(Scanner *s, const unsigned char *p, Py_ssize_t n)
{
    int r;
    if (s->tail_len) {
        Py_ssize_t take = 64 - s->tail_len;
        if (take > n)
            take = n;
        memcpy(s->tail + s->tail_len, p, (size_t)take);
        s->tail_len += (int)take;
        p += take;
        n -= take;
        if (s->tail_len < 64)
            return 0;
        s->tail_len = 0;
        if ((r = blocks(s, s->tail, 64)) < 0)
            return r;
    }
    Py_ssize_t whole = n & ~(Py_ssize_t)63;
    if (whole && (r = blocks(s, p, whole)) < 0)
        return r;
    memcpy(s->tail, p + whole, (size_t)(n - whole));
    s->tail_len = (int)(n - whole);
    return 0;
}

/* --- the Python type ------------------------------------------------------------------------------------------- */

static void scanner_free_results(Scanner *s)
{
    for (Py_ssize_t i = 0; i < s->n_arrays; i++)
        PyMem_RawFree(s->arrays[i].ends);
    PyMem_RawFree(s->arrays);
    PyMem_RawFree(s->members);
    s->arrays = NULL;
    s->members = NULL;
    s->n_arrays = s->cap_arrays = s->n_members = s->cap_members = 0;
}

static void scanner_dealloc(Scanner *s)
{
    scanner_free_results(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int scanner_init(Scanner *s, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"keep", "top_array", NULL};
    Py_ssize_t keep;
    int top_array = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|p:Scanner", names, &keep, &top_array))
        return -1;
    if (s->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the scanner is in use");
        return -1;
    }
    scanner_free_results(s);
    memset((char *)s + offsetof(Scanner, keep), 0, sizeof(Scanner) - offsetof(Scanner, keep));
    s->keep = keep < 0 ? 0 : keep;
    s->top_array = top_array;
    s->state = S_START;
    return 0;
}

static PyObject *scanner_feed(Scanner *s, PyObject *arg)
{
    Py_buffer view;
    if (s->finished) {
        PyErr_SetString(PyExc_ValueError, "feed() after finish()");
        return NULL;
    }
    if (s->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the scanner is in use");
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int r = 0;
    if (!s->failed && view.len > 0) {
        if (view.len >= RELEASE_GIL_FROM) {
            s->busy = 1;
            Py_BEGIN_ALLOW_THREADS
            r = feed_bytes(s, (const unsigned char *)view.buf, view.len);
            Py_END_ALLOW_THREADS
            s->busy = 0;
        } else {
            r = feed_bytes(s, (const unsigned char *)view.buf, view.len);
        }
    }
    PyBuffer_Release(&view);
    if (r == -2) {
        s->failed = 1;
        return PyErr_NoMemory();
    }
    if (r < 0)
        s->failed = 1;
    return PyBool_FromLong(!s->failed);
}

static PyObject *ends_list(const Array *a)
{
    PyObject *list = PyList_New(a->n_ends);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < a->n_ends; k++) {
        PyObject *item = PyLong_FromSsize_t(a->ends[k]);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, k, item);
    }
    return list;
}

static PyObject *array_tuple(const Array *a)
{
    PyObject *ends = ends_list(a);
    if (ends == NULL)
        return NULL;
    PyObject *t = Py_BuildValue("(nNnn)", a->count, ends, a->last_end, a->end);
    return t;
}

static PyObject *scanner_finish(Scanner *s, PyObject *unused)
{
    (void)unused;
    if (s->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the scanner is in use");
        return NULL;
    }
    if (!s->finished) {
        s->finished = 1;
        if (!s->failed && s->tail_len) {
            /* The last bytes, padded with spaces (whitespace at a strict level, nothing inside a nested value). */
            memset(s->tail + s->tail_len, ' ', (size_t)(64 - s->tail_len));
            int r = blocks(s, s->tail, 64);
            if (r == -2) {
                s->failed = 1;
                return PyErr_NoMemory();
            }
            if (r < 0)
                s->failed = 1;
        }
        if (s->state != S_DONE)
            s->failed = 1;
    }
    if (s->failed)
        Py_RETURN_NONE;
    if (s->top_array)
        return array_tuple(&s->arrays[0]);
    PyObject *members = PyList_New(s->n_members);
    if (members == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < s->n_members; i++) {
        const Member *m = &s->members[i];
        PyObject *array;
        if (m->array < 0)
            array = Py_NewRef(Py_None);
        else if (!s->arrays[m->array].strict)
            array = Py_NewRef(Py_False);
        else
            array = array_tuple(&s->arrays[m->array]);
        if (array == NULL) {
            Py_DECREF(members);
            return NULL;
        }
        PyObject *t = Py_BuildValue("(nnnnN)", m->start, m->key_end, m->value_start, m->end, array);
        if (t == NULL) {
            Py_DECREF(members);
            return NULL;
        }
        PyList_SET_ITEM(members, i, t);
    }
    return members;
}

static PyMethodDef scanner_methods[] = {
    {"feed", (PyCFunction)scanner_feed, METH_O,
     "feed(data) -> bool: the body's next piece (any bytes-like object); False once the scanner cannot vouch for "
     "the text (later pieces are then ignored)."},
    {"finish", (PyCFunction)scanner_finish, METH_NOARGS,
     "finish() -> the layout, or None when the scanner cannot vouch for the text. For an object: a list of "
     "(start, key_end, value_start, end, array) per member, array being None (not an array), False (an array that "
     "is not read element by element) or (count, ends, last_end, end). With top_array: that tuple for the array."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gateway.policies.board_cards._jsonscan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(keep, top_array=False): the layout of a JSON text fed piece by piece (see the module).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)scanner_init,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_methods = scanner_methods,
};

static PyObject *simd(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
#ifdef HAVE_X86
    if (blocks == blocks_avx2)
        return PyUnicode_FromString("avx2");
    if (blocks == blocks_sse2)
        return PyUnicode_FromString("sse2");
#endif
    return PyUnicode_FromString("none");
}

static PyObject *use_simd(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
#ifdef HAVE_X86
    if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("pclmul")) {
        blocks = blocks_avx2;
        Py_RETURN_TRUE;
    }
    if (strcmp(name, "sse2") == 0) {
        blocks = blocks_sse2;
        Py_RETURN_TRUE;
    }
#endif
    if (strcmp(name, "none") == 0) {
        blocks = blocks_bytes;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyMethodDef module_methods[] = {
    {"simd", simd, METH_NOARGS,
     "simd() -> str: the instructions blocks are classified with (avx2, sse2, or none: byte by byte)."},
    {"use_simd", use_simd, METH_O,
     "use_simd(name) -> bool: classify with these instructions from now on, if the CPU has them (for tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gateway.policies.board_cards._jsonscan",
    "The layout of a JSON body, read in C as its pieces arrive, for json_splice.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__jsonscan(void)
{
    init_tables();
#ifdef HAVE_X86
    init_compared();
#endif
#ifdef HAVE_X86
    __builtin_cpu_init();
    blocks = blocks_sse2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("pclmul"))
        blocks = blocks_avx2;
#endif
    if (PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
