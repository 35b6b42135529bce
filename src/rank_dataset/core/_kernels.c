/*
 * rank-dataset's native kernels: the per-line loops numpy cannot do fast, in batches.
 *
 * C99, no Python headers: loaded with ctypes by rank_dataset/core/_native_lib.py, which releases the
 * GIL for the length of each call. Every kernel takes the size of every buffer it touches and checks
 * each offset against it before reading or writing: a span outside its buffer is an error code
 * (RD_ERANGE), an output array too small for what it must hold is RD_ECAP, and nothing is read or
 * written out of bounds whatever the arguments (null pointers are accepted only with a size of 0).
 * The numpy reference (rank_dataset/core/_reference.py) defines what each one computes; the tests
 * compare the two byte for byte.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* openat, fstat, pread and syscall under -std=c99 (rd_open_files) */
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(_WIN32)
#define RD_API __declspec(dllexport)
#else
#define RD_API __attribute__((visibility("default")))
#endif

/* The per-line steps of a loop, inlined into it (a call per line costs as much as the rest). */
#if defined(__GNUC__) || defined(__clang__)
#define RD_INLINE static inline __attribute__((always_inline))
#else
#define RD_INLINE static inline
#endif

/* A hint to start loading the cache line at p (a row a few rows ahead of the copy); nothing elsewhere.
 * Measured on random rows of a 128 MB buffer: the gather runs at ~1.3x the time of merely touching
 * each row's bytes, so the distance (8 rows) matters little (8 to 64 measured the same). */
#if defined(__GNUC__) || defined(__clang__)
#define RD_PREFETCH(p) __builtin_prefetch(p)
#define RD_PREFETCH_WRITE(p) __builtin_prefetch(p, 1)
#else
#define RD_PREFETCH(p) ((void)0)
#define RD_PREFETCH_WRITE(p) ((void)0)
#endif
#define RD_PREFETCH_AHEAD 8

#define RD_OK 0
#define RD_EARG (-1)     /* a negative size, a null pointer with a size, an unknown index kind */
#define RD_ERANGE (-2)   /* a span, start or offset outside its buffer */
#define RD_ECAP (-3)     /* an output array too small */
#define RD_EOVERFLOW (-4) /* an offset too large for the offsets' type */
#define RD_EREPEAT (-5)   /* a sample asked for twice (rd_route with a bitmap) */

/* Index arrays come as int64, uint32 or int32 (the dtypes numpy callers hold). */
#define RD_I64 1
#define RD_U32 2
#define RD_I32 3

#define RD_ABI 2

RD_API int rd_abi_version(void) { return RD_ABI; }

static int kind_ok(int kind) { return kind == RD_I64 || kind == RD_U32 || kind == RD_I32; }

RD_INLINE int64_t get_index(const void *a, int kind, int64_t i) {
    if (kind == RD_I64) return ((const int64_t *)a)[i];
    if (kind == RD_U32) return (int64_t)((const uint32_t *)a)[i];
    return (int64_t)((const int32_t *)a)[i];
}

/* Whether a buffer argument is usable for size bytes (null only when empty). */
static int buf_ok(const void *p, int64_t size) { return size >= 0 && (p != NULL || size == 0); }

#define ONES UINT64_C(0x0101010101010101)
#define HIGHS UINT64_C(0x8080808080808080)
#define LOWS UINT64_C(0x7f7f7f7f7f7f7f7f)

static uint64_t load64(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* The high bit of each byte of w that is zero, exactly (no false positives across bytes). */
static uint64_t zero_bytes(uint64_t w) { return ~(((w & LOWS) + LOWS) | w | LOWS); }

#if !defined(__SSE2__)
/* Whether this machine stores words little end first. */
static int little_endian(void) {
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}
#endif

/* The index of the lowest set bit of m (m != 0). */
static int ctz64(uint64_t m) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(m);
#else
    int k = 0;
    while (!(m & 1)) {
        m >>= 1;
        k++;
    }
    return k;
#endif
}

/*
 * Bit k of the result: p[k] == byte, for the 64 bytes p[0:64] (all readable); the OR of those bytes'
 * high bits into *high. SSE2 on x86-64 (part of its baseline: no -march flag), 8-byte words elsewhere.
 */
static uint64_t mask64(const uint8_t *p, uint8_t byte, uint64_t *high) {
#if defined(__SSE2__)
    const __m128i pattern = _mm_set1_epi8((char)byte);
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(p + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(p + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(p + 48));
    *high |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d)));
    return (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(a, pattern)) |
           (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(b, pattern)) << 16 |
           (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(c, pattern)) << 32 |
           (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(d, pattern)) << 48;
#else
    uint64_t out = 0, hi = 0;
    const uint64_t pattern = ONES * byte;
    for (int j = 0; j < 8; j++) {
        uint64_t w;
        memcpy(&w, p + 8 * j, 8);
        hi |= w;
        /* 0/1 in each byte's low bit, in memory order whatever the byte order, gathered into 8 bits. */
        uint64_t z = zero_bytes(w ^ pattern) >> 7, bits = 0;
        if (z) {
            if (little_endian()) {
                bits = (z * UINT64_C(0x0102040810204080)) >> 56;
            } else {
                for (int k = 0; k < 8; k++) bits |= (uint64_t)(p[8 * j + k] == byte) << k;
            }
        }
        out |= bits << (8 * j);
    }
    *high |= (hi & HIGHS) ? 1 : 0;
    return out;
#endif
}

/*
 * The number of bytes equal to `byte` in buf[0:size], or a negative error code.
 */
RD_API int64_t rd_count_byte(const uint8_t *buf, int64_t size, int byte) {
    if (!buf_ok(buf, size) || byte < 0 || byte > 255) return RD_EARG;
    const uint64_t pattern = ONES * (uint64_t)byte;
    int64_t count = 0, i = 0;
#if defined(__SSE2__)
    /* 16 bytes at a time: a match subtracts -1 from its byte lane, up to 255 times, then one sum. */
    const __m128i vpattern = _mm_set1_epi8((char)byte);
    while (size - i >= 16) {
        __m128i acc = _mm_setzero_si128();
        int64_t blocks = (size - i) / 16;
        if (blocks > 255) blocks = 255;
        for (int64_t k = 0; k < blocks; k++, i += 16)
            acc = _mm_sub_epi8(acc, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(const void *)(buf + i)), vpattern));
        uint64_t sums[2];
        _mm_storeu_si128((__m128i *)(void *)sums, _mm_sad_epu8(acc, _mm_setzero_si128()));
        count += (int64_t)(sums[0] + sums[1]);
    }
#endif
    while (size - i >= 8) {
        /* Up to 255 words into byte-wise counters, then one horizontal sum. */
        uint64_t acc = 0;
        int64_t words = (size - i) / 8;
        if (words > 255) words = 255;
        for (int64_t k = 0; k < words; k++, i += 8) acc += zero_bytes(load64(buf + i) ^ pattern) >> 7;
        /* Byte lanes (<= 255 each) into 16-bit lanes (<= 510), then their sum (<= 2040) in the top 16 bits. */
        acc = (acc & UINT64_C(0x00ff00ff00ff00ff)) + ((acc >> 8) & UINT64_C(0x00ff00ff00ff00ff));
        count += (int64_t)((acc * UINT64_C(0x0001000100010001)) >> 48);
    }
    for (; i < size; i++) count += buf[i] == (uint8_t)byte;
    return count;
}

/*
 * The positions of the bytes equal to `byte` in buf[0:size], in order, into out[0:cap]. Returns how
 * many there are; RD_ECAP if more than cap (out then holds the first cap of them).
 */
RD_API int64_t rd_find_byte(const uint8_t *buf, int64_t size, int byte, int64_t *out, int64_t cap) {
    if (!buf_ok(buf, size) || !buf_ok(out, cap) || byte < 0 || byte > 255) return RD_EARG;
    int64_t n = 0, base = 0;
    uint64_t high = 0;
    for (; size - base >= 64; base += 64) { /* 64 bytes at a time, as the scan */
        for (uint64_t m = mask64(buf + base, (uint8_t)byte, &high); m; m &= m - 1) {
            if (n == cap) return RD_ECAP;
            out[n++] = base + ctz64(m);
        }
    }
    for (; base < size; base++) {
        if (buf[base] != (uint8_t)byte) continue;
        if (n == cap) return RD_ECAP;
        out[n++] = base;
    }
    return n;
}

/* Byte -> whether it is ASCII whitespace (space, tab, newline, CR, VT, FF). */
static int blank(uint8_t c) { return c == ' ' || (c >= 9 && c <= 13); }

/* A chunk scan's arguments and progress (see rd_scan_lines). */
struct scan {
    const uint8_t *buf;
    int64_t size, offset, mark, target, cap, marks_cap, n, lines, n_marks;
    int64_t *starts, *lengths, *marks;
    int bom;
};

/* Mark the line starting at line_start (line number st->lines) for every multiple of mark at or before it.
 * Nonzero if the marks' array is full. */
RD_INLINE int mark_line(struct scan *st, int64_t line_start) {
    while (st->target <= line_start && st->target < st->size) {
        if (st->n_marks == st->marks_cap) return 1;
        st->marks[2 * st->n_marks] = line_start + st->offset;
        st->marks[2 * st->n_marks + 1] = st->lines;
        st->n_marks++;
        st->target = st->target > INT64_MAX - st->mark ? INT64_MAX : st->target + st->mark;
    }
    return 0;
}

/* The line [s, end) (end: its newline, or the end of the buffer) as a sample if it is one. Nonzero
 * if the samples' arrays are full. */
RD_INLINE int sample(struct scan *st, int64_t s, int64_t end) {
    const uint8_t *buf = st->buf;
    if (st->bom && s == 0) s = 3;
    int64_t e = end;
    if (e > s && buf[e - 1] == '\r') e--;
    if (s >= e) return 0;
    if (buf[s] <= ' ') { /* only a line that starts with a space or a control byte can be blank */
        int64_t j = s;
        while (j < e && blank(buf[j])) j++;
        if (j == e) return 0;
    }
    if (st->n == st->cap) return 1;
    st->starts[st->n] = s + st->offset;
    st->lengths[st->n] = e - s;
    st->n++;
    return 0;
}

/*
 * The chunk scan (rank_dataset.files.index.scan.scan_buffer): the samples of the complete lines of
 * buf[0:size], which holds bytes offset.. of a file and starts a line. A sample is a line holding a
 * byte other than ASCII whitespace; its span is the line without its ending ("\n", or "\r\n", or a
 * "\r" before the end of the last line). With `last`, bytes after the final newline form a line too;
 * at offset 0 a UTF-8 byte order mark is skipped.
 *
 * starts/lengths[0:cap]: the samples' spans (starts absolute: + offset). marks[0:2*marks_cap]:
 * rows (offset, line) for each multiple of `mark` in [offset, offset + size): where the first line at
 * or after it starts (absolute) and its number counted from the chunk's first line (0).
 * result[0:4]: samples, newlines, whether buf is pure ASCII (0/1), marks.
 */
RD_API int rd_scan_lines(const uint8_t *buf, int64_t size, int64_t offset, int last, int64_t mark,
                         int64_t *starts, int64_t *lengths, int64_t cap, int64_t *marks, int64_t marks_cap,
                         int64_t *result) {
    if (!buf_ok(buf, size) || !buf_ok(starts, cap) || !buf_ok(lengths, cap) || !buf_ok(marks, marks_cap) ||
        result == NULL || offset < 0 || mark <= 0 || offset > INT64_MAX - size)
        return RD_EARG;
    struct scan st;
    st.buf = buf;
    st.size = size;
    st.offset = offset;
    st.mark = mark;
    st.starts = starts;
    st.lengths = lengths;
    st.cap = cap;
    st.marks = marks;
    st.marks_cap = marks_cap;
    st.n = st.lines = st.n_marks = 0;
    st.bom = offset == 0 && size >= 3 && buf[0] == 0xEF && buf[1] == 0xBB && buf[2] == 0xBF;
    st.target = offset % mark ? mark - offset % mark : 0; /* the next multiple of mark, relative to buf */
    uint64_t high = 0;
    int64_t line_start = 0;
    if (mark_line(&st, 0)) return RD_ECAP;
    int64_t base = 0;
    for (; size - base >= 64; base += 64) {
        uint64_t m = mask64(buf + base, '\n', &high);
        while (m) {
            int64_t nl = base + ctz64(m);
            m &= m - 1;
            if (sample(&st, line_start, nl)) return RD_ECAP;
            st.lines++;
            line_start = nl + 1;
            if (mark_line(&st, line_start)) return RD_ECAP;
        }
    }
    for (int64_t i = base; i < size; i++) {
        high |= buf[i] >> 7;
        if (buf[i] == '\n') {
            if (sample(&st, line_start, i)) return RD_ECAP;
            st.lines++;
            line_start = i + 1;
            if (mark_line(&st, line_start)) return RD_ECAP;
        }
    }
    if (last && line_start < size && sample(&st, line_start, size)) return RD_ECAP;
    result[0] = st.n;
    result[1] = st.lines;
    result[2] = high == 0;
    result[3] = st.n_marks;
    return RD_OK;
}

/* 16 bytes, loaded and stored as a unit (one unaligned vector move where the compiler has one). */
typedef struct {
    uint64_t a, b;
} rd_b16;

/* Copy len bytes from s to d, touching no byte outside [d, d + len) nor [s, s + len): rows of 16 to
 * 64 bytes (the common meta line) by four overlapping 16-byte moves, with no branch on the length
 * within that range (a call of memcpy per row costs more than the copy). */
RD_INLINE void copy_row(uint8_t *d, const uint8_t *s, int64_t len) {
    if (len >= 16 && len <= 64) {
        const int64_t o1 = len - 16 < 16 ? len - 16 : 16, o2 = len - 16 < 32 ? len - 16 : 32, o3 = len - 16;
        rd_b16 x0, x1, x2, x3;
        memcpy(&x0, s, 16);
        memcpy(&x1, s + o1, 16);
        memcpy(&x2, s + o2, 16);
        memcpy(&x3, s + o3, 16);
        memcpy(d, &x0, 16);
        memcpy(d + o1, &x1, 16);
        memcpy(d + o2, &x2, 16);
        memcpy(d + o3, &x3, 16);
    } else if (len > 64) {
        memcpy(d, s, (size_t)len);
    } else if (len >= 8) {
        uint64_t x0, x1;
        memcpy(&x0, s, 8);
        memcpy(&x1, s + len - 8, 8);
        memcpy(d, &x0, 8);
        memcpy(d + len - 8, &x1, 8);
    } else {
        for (int64_t j = 0; j < len; j++) d[j] = s[j];
    }
}

/*
 * dst[dst_starts[k]:][:lengths[k]] = src[src_starts[k]:][:lengths[k]] for each k < n (the index
 * arrays of kinds src_kind, len_kind, dst_kind). Every row is checked to lie within both buffers
 * before anything is written; a row outside them is RD_ERANGE and *bad its number.
 */
RD_API int rd_copy_rows(const uint8_t *src, int64_t src_size, const void *src_starts, int src_kind,
                        const void *lengths, int len_kind, int64_t n, uint8_t *dst, int64_t dst_size,
                        const void *dst_starts, int dst_kind, int64_t *bad) {
    if (!buf_ok(src, src_size) || !buf_ok(dst, dst_size) || n < 0 || bad == NULL || !kind_ok(src_kind) ||
        !kind_ok(len_kind) || !kind_ok(dst_kind) || (n > 0 && (!src_starts || !lengths || !dst_starts)))
        return RD_EARG;
    *bad = -1;
    for (int64_t k = 0; k < n; k++) {
        int64_t s = get_index(src_starts, src_kind, k), d = get_index(dst_starts, dst_kind, k);
        int64_t len = get_index(lengths, len_kind, k);
        if (len < 0 || s < 0 || d < 0 || s > src_size - len || d > dst_size - len) {
            *bad = k;
            return RD_ERANGE;
        }
    }
    for (int64_t k = 0; k < n; k++) {
        if (k + RD_PREFETCH_AHEAD < n) RD_PREFETCH(src + get_index(src_starts, src_kind, k + RD_PREFETCH_AHEAD));
        copy_row(dst + get_index(dst_starts, dst_kind, k), src + get_index(src_starts, src_kind, k),
                 get_index(lengths, len_kind, k));
    }
    return RD_OK;
}

/*
 * Pack rows back to back: row k (src[starts[k]:][:lengths[k]]) goes to dst[offsets[k]:offsets[k+1]],
 * offsets[0] = 0, into offsets[0:n+1] of kind off_kind (RD_U32 or RD_I64). RD_ERANGE (*bad the row)
 * for a row outside src, RD_ECAP if dst is smaller than the rows' total, RD_EOVERFLOW if the total
 * does not fit the offsets' kind. Nothing is written unless every row is in range and fits.
 */
RD_API int rd_pack_rows(const uint8_t *src, int64_t src_size, const void *starts, int start_kind, const void *lengths,
                        int len_kind, int64_t n, uint8_t *dst, int64_t dst_size, void *offsets, int off_kind,
                        int64_t *bad) {
    if (!buf_ok(src, src_size) || !buf_ok(dst, dst_size) || n < 0 || bad == NULL || offsets == NULL ||
        !kind_ok(start_kind) || !kind_ok(len_kind) || (off_kind != RD_U32 && off_kind != RD_I64) ||
        (n > 0 && (!starts || !lengths)))
        return RD_EARG;
    *bad = -1;
    int64_t total = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t s = get_index(starts, start_kind, k), len = get_index(lengths, len_kind, k);
        if (len < 0 || s < 0 || s > src_size - len) {
            *bad = k;
            return RD_ERANGE;
        }
        if (len > dst_size - total) return RD_ECAP; /* total <= dst_size: no overflow */
        total += len;
    }
    if (off_kind == RD_U32 && total > (int64_t)UINT32_MAX) return RD_EOVERFLOW;
    int64_t at = 0;
    for (int64_t k = 0; k < n; k++) {
        if (k + RD_PREFETCH_AHEAD < n) RD_PREFETCH(src + get_index(starts, start_kind, k + RD_PREFETCH_AHEAD));
        int64_t len = get_index(lengths, len_kind, k);
        if (off_kind == RD_U32) ((uint32_t *)offsets)[k] = (uint32_t)at;
        else ((int64_t *)offsets)[k] = at;
        copy_row(dst + at, src + get_index(starts, start_kind, k), len);
        at += len;
    }
    if (off_kind == RD_U32) ((uint32_t *)offsets)[n] = (uint32_t)at;
    else ((int64_t *)offsets)[n] = at;
    return RD_OK;
}

/* The length of the valid UTF-8 sequence at p[0:left], or 0 if it is not one (Unicode table 3-7:
 * no overlong forms, no surrogates, nothing past U+10FFFF, nothing cut short). */
static int utf8_sequence(const uint8_t *p, int64_t left) {
    uint8_t c = p[0];
    if (c < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) need = 2;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else return 0;
    if (left < need + 1) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (int k = 2; k <= need; k++)
        if (p[k] < 0x80 || p[k] > 0xBF) return 0;
    return need + 1;
}

/* The first byte at or after i in p[0:end] with its high bit set (not ASCII), or end. */
static int64_t first_high(const uint8_t *p, int64_t i, int64_t end) {
#if defined(__SSE2__)
    for (; end - i >= 16; i += 16) {
        int m = _mm_movemask_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + i)));
        if (m) return i + ctz64((uint64_t)(unsigned)m);
    }
#else
    for (; end - i >= 8; i += 8)
        if (load64(p + i) & HIGHS) break;
#endif
    for (; i < end; i++)
        if (p[i] & 0x80) return i;
    return end;
}

/* Offsets into data (bounds[0:n+1], of kind kind) checked: ascending, within size. */
static int bounds_ok(int64_t size, const void *bounds, int kind, int64_t n) {
    int64_t prev = get_index(bounds, kind, 0);
    if (prev < 0 || prev > size) return 0;
    for (int64_t k = 1; k <= n; k++) {
        int64_t b = get_index(bounds, kind, k);
        if (b < prev || b > size) return 0;
        prev = b;
    }
    return 1;
}

/*
 * The first row k < n whose bytes data[bounds[k]:bounds[k+1]] are not valid UTF-8 into *row (-1 if
 * none). bounds holds n + 1 ascending offsets within data (RD_ERANGE if not).
 */
RD_API int rd_utf8_first_invalid(const uint8_t *data, int64_t size, const void *bounds, int kind, int64_t n,
                                 int64_t *row) {
    if (!buf_ok(data, size) || n < 0 || row == NULL || bounds == NULL || !kind_ok(kind)) return RD_EARG;
    *row = -1;
    if (!bounds_ok(size, bounds, kind, n)) return RD_ERANGE;
    /* From one byte that is not ASCII to the next (ASCII 16 bytes at a time), each a sequence that
     * must end within its row; the row holding it found by a cursor that only moves forward. */
    const int64_t end = get_index(bounds, kind, n);
    int64_t r = 0, i = get_index(bounds, kind, 0);
    while ((i = first_high(data, i, end)) < end) {
        while (get_index(bounds, kind, r + 1) <= i) r++;
        int k = utf8_sequence(data + i, get_index(bounds, kind, r + 1) - i);
        if (!k) {
            *row = r;
            return RD_OK;
        }
        i += k;
    }
    return RD_OK;
}

/* The first newline in p[i:end], or end. */
static int64_t find_newline(const uint8_t *p, int64_t i, int64_t end) {
#if defined(__SSE2__)
    const __m128i nl = _mm_set1_epi8('\n');
    for (; end - i >= 16; i += 16) {
        int m = _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + i)), nl));
        if (m) return i + ctz64((uint64_t)(unsigned)m);
    }
#else
    for (; end - i >= 8; i += 8)
        if (zero_bytes(load64(p + i) ^ (ONES * 10u))) break;
#endif
    for (; i < end; i++)
        if (p[i] == '\n') return i;
    return end;
}

/*
 * The first row k < n of buf[starts[k]:ends[k]] (int64 offsets) that is not a sample's text, into
 * *row (-1 if none): one that holds a newline, or nothing but ASCII whitespace (an empty row too).
 * A row outside buf, or ending before it starts, is RD_ERANGE (*row its number).
 */
RD_API int rd_lines_bad(const uint8_t *buf, int64_t size, const int64_t *starts, const int64_t *ends, int64_t n,
                        int64_t *row) {
    if (!buf_ok(buf, size) || n < 0 || row == NULL || (n > 0 && (!starts || !ends))) return RD_EARG;
    *row = -1;
    int64_t from = 0, next_nl = -1; /* the first newline at or after from */
    for (int64_t k = 0; k < n; k++) {
        int64_t s = starts[k], e = ends[k];
        if (s < 0 || e < s || e > size) {
            *row = k;
            return RD_ERANGE;
        }
        /* A newline in the row: where rows come in ascending order (a shard's do), the next newline
         * after the last one found serves every row before it, so the search runs once over the
         * buffer; a row before the last searched from is searched alone. Then, for a row that starts
         * with whitespace (or is empty), whether anything else follows. */
        int bad_row;
        if (s >= from) {
            if (next_nl < s) next_nl = find_newline(buf, s, size);
            from = s;
            bad_row = next_nl < e;
        } else {
            bad_row = find_newline(buf, s, e) < e;
        }
        if (!bad_row && (s == e || buf[s] <= ' ')) {
            int64_t j = s;
            while (j < e && blank(buf[j])) j++;
            bad_row = j == e;
        }
        if (bad_row) {
            *row = k;
            return RD_OK;
        }
    }
    return RD_OK;
}

/* Positions a permutation call mixes side by side. */
#define PERMUTE_LANES 16

/* murmur3's 32-bit finaliser of x ^ key: the round function of the permutation (plan/permutation.py). */
RD_INLINE uint32_t mix32(uint32_t x, uint32_t key) {
    uint32_t h = x ^ key;
    h ^= h >> 16;
    h *= UINT32_C(0x85EBCA6B);
    h ^= h >> 13;
    h *= UINT32_C(0xC2B2AE35);
    h ^= h >> 16;
    return h;
}

/* A permutation's grid: rows x 2**col_bits cells, and the constants of h % rows by multiplication. */
struct grid {
    int col_bits, sh1, sh2;
    uint32_t mask, rows;
    uint64_t magic;
};

/* (hi + h % rows) mod rows, hi < rows, the sum modulo 2**32 as numpy's uint32 (no wrap below 2**31 rows). */
RD_INLINE uint32_t add_mod_rows(const struct grid *g, uint32_t hi, uint32_t h) {
    const uint32_t t = (uint32_t)((g->magic * h) >> 32);
    const uint32_t q = (t + ((h - t) >> g->sh1)) >> g->sh2;
    const uint32_t y = hi + (h - q * g->rows);
    return y >= g->rows ? y - g->rows : y;
}

/* One pass of the rounds over cell x. */
static int64_t feistel(const struct grid *g, const uint32_t *keys, int rounds, int64_t x) {
    uint32_t hi = (uint32_t)(x >> g->col_bits), lo = (uint32_t)x & g->mask;
    for (int k = 0; k < rounds; k++) {
        if (k % 2 == 0) lo = (lo + mix32(hi, keys[k])) & g->mask;
        else hi = add_mod_rows(g, hi, mix32(lo, keys[k]));
    }
    return (int64_t)((uint64_t)hi << g->col_bits | lo);
}

/*
 * The keyed permutation of [0, n) at positions pos[0:count] into out[0:count]
 * (rank_dataset.plan.permutation.permute): a position is a cell (hi, lo) of a grid of rows x 2**col_bits
 * cells (>= n), mixed by `rounds` Feistel rounds of keys[0:rounds] (even rounds add a hash of hi to lo
 * modulo 2**col_bits, odd rounds a hash of lo to hi modulo rows), walked again while it lands past n.
 * A position outside [0, n) is RD_ERANGE (*bad its index), before anything is written.
 */
RD_API int rd_permute(int64_t n, int64_t rows, int col_bits, const uint32_t *keys, int rounds, const int64_t *pos,
                      int64_t count, int64_t *out, int64_t *bad) {
    if (n < 1 || rows < 1 || rows > (int64_t)UINT32_MAX || col_bits < 0 || col_bits > 32 || rounds < 0 ||
        rounds > 64 || (rounds > 0 && keys == NULL) || count < 0 || bad == NULL ||
        (count > 0 && (pos == NULL || out == NULL)))
        return RD_EARG;
    /* The grid must hold [0, n) and its cells fit an int64. */
    if (rows > (INT64_MAX >> col_bits) || (rows << col_bits) < n) return RD_EARG;
    *bad = -1;
    for (int64_t i = 0; i < count; i++) {
        if (pos[i] < 0 || pos[i] >= n) {
            *bad = i;
            return RD_ERANGE;
        }
    }
    struct grid g;
    g.col_bits = col_bits;
    g.mask = (uint32_t)((UINT64_C(1) << col_bits) - 1);
    g.rows = (uint32_t)rows;
    /* h % rows by a multiply and shifts (Granlund and Montgomery 1994, figure 4.1): a division costs
     * several times as much, three times a round. */
    int l = 0;
    while (l < 32 && (UINT64_C(1) << l) < (uint64_t)rows) l++;
    g.magic = (((UINT64_C(1) << l) - (uint64_t)rows) << 32) / (uint64_t)rows + 1;
    g.sh1 = l < 1 ? l : 1;
    g.sh2 = l > 1 ? l - 1 : 0;
    const uint32_t mask = g.mask;
    /* PERMUTE_LANES positions at a time, each round over all of them: their rounds are independent,
     * so the processor overlaps them (one position's rounds, in a chain, would wait on each multiply). */
    for (int64_t i0 = 0; i0 < count; i0 += PERMUTE_LANES) {
        const int lanes = count - i0 < PERMUTE_LANES ? (int)(count - i0) : PERMUTE_LANES;
        uint32_t hi[PERMUTE_LANES], lo[PERMUTE_LANES];
        for (int j = 0; j < lanes; j++) {
            hi[j] = (uint32_t)(pos[i0 + j] >> col_bits);
            lo[j] = (uint32_t)pos[i0 + j] & mask;
        }
        for (int k = 0; k < rounds; k++) {
            const uint32_t key = keys[k];
            if (k % 2 == 0) {
                for (int j = 0; j < lanes; j++) lo[j] = (lo[j] + mix32(hi[j], key)) & mask;
            } else {
                for (int j = 0; j < lanes; j++) hi[j] = add_mod_rows(&g, hi[j], mix32(lo[j], key));
            }
        }
        for (int j = 0; j < lanes; j++) {
            int64_t x = (int64_t)((uint64_t)hi[j] << col_bits | lo[j]);
            while (x >= n) x = feistel(&g, keys, rounds, x); /* past n (rare: < 2 sqrt(n) + 1 cells): walk on */
            out[i0 + j] = x;
        }
    }
    return RD_OK;
}

/* The check of one row of rd_check_lines (row k: bytes [s, s + len) of the file, at buf[rs:]): 1 if it
 * is a sample, 0 if not, -1 if it or the bytes around it that its checks need are not in buf. *from and
 * *next_nl carry the newline search from one row to the next (as rd_lines_bad). */
RD_INLINE int line_ok(const uint8_t *buf, int64_t size, int64_t rs, int64_t s, int64_t len, int64_t file_size,
                      int bom, int64_t *from, int64_t *next_nl) {
    if (rs < 0 || s < 0 || len < 0 || rs > size - len || s > file_size - len) return -1;
    const int64_t re = rs + len, e = s + len;
    /* The bytes the checks read: the one before (unless the row starts the file or follows its
     * byte order mark), the one after (unless at the end of the file), and the next after a "\r". */
    const int needs_before = !(s == 0 || (s == 3 && bom));
    const int needs_after = e < file_size;
    if ((needs_before && rs < 1) || (needs_after && re >= size) ||
        (needs_after && buf[re] == '\r' && e + 1 < file_size && re + 1 >= size))
        return -1;
    int ok = len > 0;
    if (ok) {
        if (s == 0) ok = !bom;
        else ok = (s == 3 && bom) || buf[rs - 1] == '\n';
    }
    if (ok) {
        const uint8_t last_byte = buf[re - 1];
        if (!needs_after) ok = last_byte != '\r';
        else if (buf[re] == '\n') ok = last_byte != '\r';
        else ok = buf[re] == '\r' && (e + 1 >= file_size || buf[re + 1] == '\n');
    }
    if (ok) {
        if (rs >= *from) {
            if (*next_nl < rs) *next_nl = find_newline(buf, rs, size);
            *from = rs;
            ok = *next_nl >= re;
        } else {
            ok = find_newline(buf, rs, re) >= re;
        }
    }
    if (ok && buf[rs] <= ' ') {
        int64_t j = rs;
        while (j < re && blank(buf[j])) j++;
        ok = j < re;
    }
    return ok;
}

/* Rows a check looks ahead to start loading, and where: the byte before the row and its end (both
 * read by the checks; a row of a few dozen bytes, the lines they lie on). A row's checks read bytes
 * far apart (a shard's rows lie a few hundred bytes apart in the window, in no order within a
 * bucket of samples), which the hardware does not foresee: on a rank's rows of a 10M-line file
 * (W = 8, windows of a decompressed file not in the cache) the check took 0.083 s without the hint,
 * 0.072 s with the row's start 16 rows ahead, 0.034 s with both lines 32 rows ahead. Nothing is
 * read: an offset outside buf (not yet checked) is passed over. */
#define RD_CHECK_AHEAD 32

RD_INLINE void prefetch_row(const uint8_t *buf, int64_t size, int64_t rs, int64_t len) {
    if (rs > 0 && rs <= size) RD_PREFETCH(buf + rs - 1);
    if (rs >= 0 && len >= 0 && rs < size - len) RD_PREFETCH(buf + rs + len);
}

/*
 * The gather's checks of rows copied from a window of a file: the first row k < n that is not a
 * sample of the file into *row (-1 if none). Row k is bytes [starts[k], starts[k] + lengths[k]) of a
 * file of file_size bytes, held at buf[at[k]:] (and the bytes around it the checks read: the one
 * before it, the two after it, where the file has them). A sample starts the file (after its byte
 * order mark, if bom) or follows a newline; it ends at the end of the file, or before a "\n" that
 * does not follow a "\r", or before a "\r" that ends the file or comes before a "\n"; it holds no
 * newline and something other than ASCII whitespace (rank_dataset.files.read._gather's _bounds_ok and
 * _rows_ok, and the newline search after the copy). A row whose bytes, or the bytes around it that
 * its checks need, are not in buf is RD_ERANGE (*row its number).
 */
RD_API int rd_check_lines(const uint8_t *buf, int64_t size, const int64_t *at, const int64_t *starts,
                          const int64_t *lengths, int64_t n, int64_t file_size, int bom, int64_t *row) {
    if (!buf_ok(buf, size) || n < 0 || row == NULL || file_size < 0 || (n > 0 && (!at || !starts || !lengths)))
        return RD_EARG;
    *row = -1;
    int64_t from = 0, next_nl = -1; /* as rd_lines_bad: the first newline in buf at or after from */
    for (int64_t k = 0; k < n; k++) {
        if (k + RD_CHECK_AHEAD < n) prefetch_row(buf, size, at[k + RD_CHECK_AHEAD], lengths[k + RD_CHECK_AHEAD]);
        const int ok = line_ok(buf, size, at[k], starts[k], lengths[k], file_size, bom, &from, &next_nl);
        if (ok < 0) {
            *row = k;
            return RD_ERANGE;
        }
        if (!ok) {
            *row = k;
            return RD_OK;
        }
    }
    return RD_OK;
}

/*
 * The gather of one window, fused (rank_dataset.files.read._gather): row k < n is bytes [starts[k],
 * starts[k] + len) of a file of file_size bytes, held at buf[starts[k] - shift:], and goes to
 * dst[bounds[r]:bounds[r + 1]], r = rows[k] (of kind rows_kind; bounds: n_bounds offsets of kind
 * bounds_kind), whose width is its length. Rows are taken in order: each is checked as rd_check_lines
 * checks it, then copied. A row outside its buffers (r not below n_bounds - 1, its place outside dst,
 * its bytes or those its checks need outside buf) is RD_ERANGE, *row its number; the first row that
 * is not a sample stops the gather, *row its number (-1 if none). The rows before either are copied.
 */
RD_API int rd_gather_lines(const uint8_t *buf, int64_t size, int64_t shift, const int64_t *starts,
                           const void *rows, int rows_kind, int64_t n, const void *bounds, int bounds_kind,
                           int64_t n_bounds, uint8_t *dst, int64_t dst_size, int64_t file_size, int bom,
                           int64_t *row) {
    if (!buf_ok(buf, size) || !buf_ok(dst, dst_size) || n < 0 || row == NULL || file_size < 0 || shift < 0 ||
        !kind_ok(rows_kind) || !kind_ok(bounds_kind) || n_bounds < 0 || (n_bounds > 0 && bounds == NULL) ||
        (n > 0 && (!starts || !rows)))
        return RD_EARG;
    *row = -1;
    int64_t from = 0, next_nl = -1;
    for (int64_t k = 0; k < n; k++) {
        if (k + RD_PREFETCH_AHEAD < n) {
            /* The random reads: the row's place in the offsets (its bytes in buf come in file order). */
            const int64_t ahead = get_index(rows, rows_kind, k + RD_PREFETCH_AHEAD);
            if (ahead >= 0 && ahead < n_bounds)
                RD_PREFETCH((const uint8_t *)bounds + ahead * (bounds_kind == RD_I64 ? 8 : 4));
        }
        if (k + RD_CHECK_AHEAD < n) {
            const int64_t sa = starts[k + RD_CHECK_AHEAD];
            if (sa > shift && sa - shift <= size) RD_PREFETCH(buf + (sa - shift) - 1);
        }
        const int64_t r = get_index(rows, rows_kind, k);
        if (r < 0 || r >= n_bounds - 1) {
            *row = k;
            return RD_ERANGE;
        }
        const int64_t d = get_index(bounds, bounds_kind, r), len = get_index(bounds, bounds_kind, r + 1) - d;
        const int64_t s = starts[k];
        if (d < 0 || len < 0 || d > dst_size - len || s < 0) { /* (s, shift >= 0: s - shift cannot overflow) */
            *row = k;
            return RD_ERANGE;
        }
        const int ok = line_ok(buf, size, s - shift, s, len, file_size, bom, &from, &next_nl);
        if (ok < 0) {
            *row = k;
            return RD_ERANGE;
        }
        if (!ok) {
            *row = k;
            return RD_OK;
        }
        copy_row(dst + d, buf + (s - shift), len);
    }
    return RD_OK;
}

/*
 * A stable counting sort of keys[0:n] (each below `buckets`, at most 65536 of them): out[0:n] (of
 * kind out_kind, RD_I64 or RD_U32) the item numbers in ascending key order, items of one key in
 * their order (numpy's argsort(keys, kind="stable")), and counts[0:buckets] how many items hold each
 * key. A key at or past `buckets` is RD_ERANGE (*bad its item) before out is written; RD_U32 takes
 * at most 2**32 items.
 */
RD_API int rd_bucket_order(const uint16_t *keys, int64_t n, int64_t buckets, void *out, int out_kind,
                           int64_t *counts, int64_t *bad) {
    if (n < 0 || buckets < 1 || buckets > 65536 || counts == NULL || bad == NULL ||
        (out_kind != RD_I64 && out_kind != RD_U32) || (n > 0 && (keys == NULL || out == NULL)) ||
        (out_kind == RD_U32 && n > (int64_t)UINT32_MAX + 1))
        return RD_EARG;
    *bad = -1;
    for (int64_t b = 0; b < buckets; b++) counts[b] = 0;
    for (int64_t i = 0; i < n; i++) {
        if (keys[i] >= buckets) {
            *bad = i;
            return RD_ERANGE;
        }
        counts[keys[i]]++;
    }
    /* counts[b] becomes where key b's items start, then (as they are placed) where they end; the
     * counts are those ends' differences (no second array: 512 KiB would not sit on a stack). */
    int64_t sum = 0;
    for (int64_t b = 0; b < buckets; b++) {
        const int64_t c = counts[b];
        counts[b] = sum;
        sum += c;
    }
    if (out_kind == RD_U32) {
        uint32_t *o = (uint32_t *)out;
        for (int64_t i = 0; i < n; i++) o[counts[keys[i]]++] = (uint32_t)i;
    } else {
        int64_t *o = (int64_t *)out;
        for (int64_t i = 0; i < n; i++) o[counts[keys[i]]++] = i;
    }
    for (int64_t b = buckets - 1; b > 0; b--) counts[b] -= counts[b - 1];
    return RD_OK;
}

/* 1 when bounds[0..segments] rises from 0 to n, never decreasing. */
static int rd_bounds_ok(const int64_t *bounds, int64_t segments, int64_t n) {
    if (bounds[0] != 0 || bounds[segments] != n) return 0;
    for (int64_t b = 0; b < segments; b++)
        if (bounds[b + 1] < bounds[b]) return 0;
    return 1;
}

/* Greedy packing (rank_dataset/plan/shapes.py): each segment costs[bounds[b]:bounds[b+1]] is cut into
 * runs of total at most limit, its first run continuing an open one of total fill[b]; starts[i] = 1 where
 * item i does not fit the run before it, totals[b] the segment's last run's total. A cost outside
 * [0, limit] is RD_ERANGE with its item in *bad. */
RD_API int rd_pack_runs(const int64_t *costs, int64_t n, const int64_t *bounds, int64_t segments, int64_t limit,
                        const int64_t *fill, uint8_t *starts, int64_t *totals, int64_t *bad) {
    if (n < 0 || segments < 0 || limit < 0 || bounds == NULL || bad == NULL ||
        (segments > 0 && (fill == NULL || totals == NULL)) || (n > 0 && (costs == NULL || starts == NULL)))
        return RD_EARG;
    *bad = -1;
    if (!rd_bounds_ok(bounds, segments, n)) return RD_EARG;
    for (int64_t b = 0; b < segments; b++)
        if (fill[b] < 0 || fill[b] > limit) return RD_EARG;
    if (n > 0) memset(starts, 0, (size_t)n);
    for (int64_t b = 0; b < segments; b++) {
        int64_t t = fill[b];
        for (int64_t i = bounds[b]; i < bounds[b + 1]; i++) {
            const int64_t c = costs[i];
            if (c < 0 || c > limit) {
                *bad = i;
                return RD_ERANGE;
            }
            if (t > limit - c) { /* t + c > limit, without overflow */
                starts[i] = 1;
                t = 0;
            }
            t += c;
        }
        totals[b] = t;
    }
    return RD_OK;
}

/* The split of batches among ranks by cost (rank_dataset/plan/shapes.py split_by_cost). */
typedef struct {
    int64_t cost, item;
} rd_costed;

/* Whether x goes before y: cost high first, then the earlier item (a total order). */
RD_INLINE int rd_costed_before(const rd_costed *x, const rd_costed *y) {
    return x->cost > y->cost || (x->cost == y->cost && x->item < y->item);
}

/* Sort a[0:n] by rd_costed_before, tmp of n more: runs of 16 by insertion, then merged bottom-up. Returns
 * the array that holds the result (a or tmp). */
static rd_costed *rd_costed_sort(rd_costed *a, rd_costed *tmp, int64_t n) {
    for (int64_t lo = 0; lo < n; lo += 16) {
        const int64_t hi = lo + 16 < n ? lo + 16 : n;
        for (int64_t i = lo + 1; i < hi; i++) {
            const rd_costed v = a[i];
            int64_t j = i - 1;
            while (j >= lo && rd_costed_before(&v, &a[j])) {
                a[j + 1] = a[j];
                j--;
            }
            a[j + 1] = v;
        }
    }
    rd_costed *src = a, *dst = tmp;
    for (int64_t width = 16; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            const int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = rd_costed_before(&src[j], &src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        rd_costed *t = src;
        src = dst;
        dst = t;
    }
    return src;
}

/* out[i] the rank of item i of the batches costs[offsets[b]:offsets[b+1]]: a batch's items by cost, highest
 * first (ties: the earlier); round k hands its world items, highest first, to the ranks ordered by their
 * totals so far, lowest first (ties: the lower rank). scratch holds 4 int64 per item of the longest batch;
 * totals and order world each. */
RD_API int rd_split_costs(const int64_t *costs, int64_t n, const int64_t *offsets, int64_t batches, int64_t world,
                          int64_t *scratch, int64_t scratch_size, int64_t *totals, int64_t *order, int64_t *out) {
    if (n < 0 || batches < 0 || world < 1 || offsets == NULL || totals == NULL || order == NULL ||
        (n > 0 && (costs == NULL || out == NULL || scratch == NULL)))
        return RD_EARG;
    if (!rd_bounds_ok(offsets, batches, n)) return RD_EARG;
    for (int64_t b = 0; b < batches; b++)
        if (4 * (offsets[b + 1] - offsets[b]) > scratch_size) return RD_EARG;
    rd_costed *items = (rd_costed *)scratch;
    for (int64_t b = 0; b < batches; b++) {
        const int64_t a = offsets[b], len = offsets[b + 1] - a;
        for (int64_t j = 0; j < len; j++) {
            items[j].cost = costs[a + j];
            items[j].item = j;
        }
        const rd_costed *sorted = rd_costed_sort(items, items + len, len);
        for (int64_t r = 0; r < world; r++) {
            totals[r] = 0;
            order[r] = r;
        }
        for (int64_t k = 0; k < len; k += world) {
            /* the ranks by (total, rank), an insertion sort from the last round's order (nearly sorted) */
            for (int64_t i = 1; i < world; i++) {
                const int64_t r = order[i];
                int64_t j = i - 1;
                while (j >= 0 && (totals[order[j]] > totals[r] || (totals[order[j]] == totals[r] && order[j] > r))) {
                    order[j + 1] = order[j];
                    j--;
                }
                order[j + 1] = r;
            }
            const int64_t m = len - k < world ? len - k : world;
            for (int64_t j = 0; j < m; j++) {
                const int64_t r = order[j];
                out[a + sorted[k + j].item] = r;
                totals[r] += sorted[k + j].cost;
            }
        }
    }
    return RD_OK;
}

/* ---- the collective reader's exchange (rank_dataset/shards/collective/_rounds.py) ---------------- */

/* Store v at a[i], a of kind RD_I64, RD_U32 or RD_I32 (the caller checked that v fits). */
RD_INLINE void set_index(void *a, int kind, int64_t i, int64_t v) {
    if (kind == RD_I64) ((int64_t *)a)[i] = v;
    else if (kind == RD_U32) ((uint32_t *)a)[i] = (uint32_t)v;
    else ((int32_t *)a)[i] = (int32_t)v;
}

/* The largest value an index array of this kind holds. */
static int64_t kind_max(int kind) {
    return kind == RD_I64 ? INT64_MAX : kind == RD_U32 ? (int64_t)UINT32_MAX : (int64_t)INT32_MAX;
}

/* What routes a sample: the owners' first samples owned[0:w+1] (owned[0] = 0, ascending, owned[w] the
 * total) and per_round, with a reciprocal of per_round for the division (a 64-bit division per item,
 * twice, costs as much as the rest of the routing). */
struct router {
    const int64_t *owned;
    int64_t w, rounds, per_round;
    double inverse;
};

/* The key owner * rounds + round of sample x (0 <= x < owned[w]) and its number within its owner's
 * slice into *local; -1 if its round is not below rounds. */
RD_INLINE int64_t route_one(const struct router *rt, int64_t x, int64_t *local) {
    /* The last owner whose first sample is <= x (owned[0] = 0 is), by a search without branches: the
     * owners of random samples are random, and a mispredicted branch a step cost most of the routing. */
    const int64_t *base = rt->owned;
    for (int64_t len = rt->w; len > 1;) {
        const int64_t half = len / 2;
        base = base[half] <= x ? base + half : base;
        len -= half;
    }
    const int64_t lo = base - rt->owned, j = x - *base;
    int64_t r = (int64_t)((double)j * rt->inverse); /* within one of j / per_round: corrected */
    if (r < 0) r = 0;
    while (r > 0 && r * rt->per_round > j) r--;
    while ((r + 1) * rt->per_round <= j) r++;
    *local = j;
    return r < rt->rounds ? lo * rt->rounds + r : -1;
}

/*
 * A build's requests grouped (rank_dataset.core._reference.route_items): each of items[0:n] (global
 * sample numbers) is owned by the rank o whose owned[o] <= x < owned[o + 1] and served in round
 * (x - owned[o]) / per_round; its key is o * rounds + round. counts[0:w*rounds]: the items of each
 * key; order[0:n] (kind order_kind: RD_I32 or RD_I64): the items' indices grouped by key, stably;
 * request[0:n] (kind req_kind: RD_U32 or RD_I64): each grouped item's number within its owner's slice.
 * With seen (a bitmap of seen_size >= (span + 7) / 8 bytes, all zero, span the smaller of per_round
 * and the largest slice), a sample that occurs twice is RD_EREPEAT (*bad an item that repeats an
 * earlier one; the grouping is then of no use); seen is left all zero. An item outside [0, owned[w]),
 * or whose round is not below rounds, is RD_ERANGE (*bad its index); owned not ascending from 0 is
 * RD_EARG.
 */
RD_API int rd_route(const int64_t *items, int64_t n, const int64_t *owned, int64_t w, int64_t rounds, int64_t per_round,
                    uint8_t *seen, int64_t seen_size, int64_t *counts, void *order, int order_kind, void *request,
                    int req_kind, int64_t *bad) {
    if (n < 0 || w < 1 || rounds < 1 || per_round < 1 || owned == NULL || counts == NULL || bad == NULL ||
        !buf_ok(seen, seen_size) || (order_kind != RD_I32 && order_kind != RD_I64) ||
        (req_kind != RD_U32 && req_kind != RD_I64) || (n > 0 && (!items || !order || !request)))
        return RD_EARG;
    if (rounds > INT64_MAX / w || n - 1 > kind_max(order_kind)) return RD_EARG;
    *bad = -1;
    if (owned[0] != 0) return RD_EARG;
    for (int64_t o = 0; o < w; o++)
        if (owned[o + 1] < owned[o]) return RD_EARG;
    const int64_t total = owned[w];
    if (total > INT64_MAX / 4 || per_round > INT64_MAX / 4) return RD_EARG; /* no product below overflows */
    /* A slice's numbers fit the requests' kind (below its largest slice's size). */
    int64_t largest = 0;
    for (int64_t o = 0; o < w; o++) {
        if (owned[o + 1] - owned[o] - 1 > kind_max(req_kind)) return RD_EARG;
        if (owned[o + 1] - owned[o] > largest) largest = owned[o + 1] - owned[o];
    }
    const int64_t span = per_round < largest ? per_round : largest;
    if (seen != NULL && seen_size < span / 8 + (span % 8 != 0)) return RD_EARG;
    struct router rt = {owned, w, rounds, per_round, 1.0 / (double)per_round};
    const int64_t parts = w * rounds;
    /* Each item's key, kept from the first pass for the second where it fits 2 bytes (else found
     * again): the scratch is freed before returning. */
    uint16_t *keys = parts <= 65536 && n > 0 ? (uint16_t *)malloc((size_t)n * sizeof(uint16_t)) : NULL;
    int64_t *firsts = keys ? (int64_t *)malloc((size_t)parts * sizeof(int64_t)) : NULL; /* a key's owned[o] */
    if (keys && !firsts) {
        free(keys);
        keys = NULL;
    }
    for (int64_t k = 0; k < parts; k++) counts[k] = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t x = items[i];
        int64_t local, key;
        if (x < 0 || x >= total || (key = route_one(&rt, x, &local)) < 0) {
            *bad = i;
            free(keys);
            free(firsts);
            return RD_ERANGE;
        }
        if (keys) keys[i] = (uint16_t)key;
        counts[key]++;
    }
    /* counts become each key's next place (then back to counts): a stable counting sort. */
    int64_t at = 0;
    for (int64_t k = 0; k < parts; k++) {
        const int64_t c = counts[k];
        counts[k] = at;
        at += c;
    }
    if (keys) {
        for (int64_t k = 0; k < parts; k++) firsts[k] = owned[k / rounds];
        for (int64_t i = 0; i < n; i++) {
            const int64_t key = keys[i], place = counts[key]++;
            set_index(order, order_kind, place, i);
            set_index(request, req_kind, place, items[i] - firsts[key]);
        }
        free(keys);
        free(firsts);
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t local;
            const int64_t key = route_one(&rt, items[i], &local), place = counts[key]++;
            set_index(order, order_kind, place, i);
            set_index(request, req_kind, place, local);
        }
    }
    for (int64_t k = parts - 1; k > 0; k--) counts[k] = counts[k] - counts[k - 1];
    /* counts[0] is now its end, which is its count. */
    if (seen == NULL) return RD_OK;
    /* Repeats, found a group at a time: a sample's group holds every occurrence of it, and the group's
     * samples lie within one round of one slice, so the bitmap is of a round (small enough to stay in
     * the cache), not of every sample; its bits are cleared again after each group. */
    int64_t first = 0;
    for (int64_t k = 0; k < parts; k++) {
        const int64_t end = first + counts[k], base = (k % rounds) * per_round;
        int64_t j = first, found = -1;
        for (; j < end; j++) {
            const int64_t b = get_index(request, req_kind, j) - base; /* in [0, span): routed so */
            const uint8_t bit = (uint8_t)(1u << (b & 7));
            if (seen[b >> 3] & bit) {
                found = get_index(order, order_kind, j);
                break;
            }
            seen[b >> 3] |= bit;
        }
        for (int64_t c = first; c < j; c++) {
            const int64_t b = get_index(request, req_kind, c) - base;
            seen[b >> 3] = 0;
        }
        if (found >= 0) {
            *bad = found;
            return RD_EREPEAT;
        }
        first = end;
    }
    return RD_OK;
}

/*
 * A requester's shard offsets from the lengths its owners sent: lengths[0:n] (kind len_kind) are the
 * lengths of the items order[0:n] (kind order_kind), which are consecutive groups of counts[0:parts]
 * items. Sets bounds[1 + order[j]] = lengths[j] (bounds[0:n+1], of kind bounds_kind: RD_U32 or
 * RD_I64; a place no j names keeps what it held), then bounds[0] = 0 and the running sums in place;
 * and sums[0:parts] the bytes of each group. An order outside [0, n), or counts that do not add up to
 * n, are RD_ERANGE (*bad the item); RD_EOVERFLOW if the sums do not fit bounds' kind.
 */
RD_API int rd_scatter_bounds(const void *lengths, int len_kind, const void *order, int order_kind, int64_t n,
                             const int64_t *counts, int64_t parts, void *bounds, int bounds_kind, int64_t *sums,
                             int64_t *bad) {
    if (n < 0 || parts < 0 || bad == NULL || bounds == NULL || !kind_ok(len_kind) || !kind_ok(order_kind) ||
        (bounds_kind != RD_U32 && bounds_kind != RD_I64) || (n > 0 && (!lengths || !order)) ||
        (parts > 0 && (!counts || !sums)))
        return RD_EARG;
    *bad = -1;
    int64_t j = 0;
    for (int64_t k = 0; k < parts; k++) {
        if (counts[k] < 0 || counts[k] > n - j) return RD_ERANGE;
        int64_t sum = 0;
        for (const int64_t end = j + counts[k]; j < end; j++) {
            const int64_t len = get_index(lengths, len_kind, j), row = get_index(order, order_kind, j);
            if (len < 0 || row < 0 || row >= n) {
                *bad = j;
                return RD_ERANGE;
            }
            if (sum > INT64_MAX - len) return RD_EOVERFLOW;
            sum += len;
        }
        sums[k] = sum;
    }
    if (j != n) return RD_ERANGE;
    for (j = 0; j < n; j++)
        set_index(bounds, bounds_kind, 1 + get_index(order, order_kind, j), get_index(lengths, len_kind, j));
    const int64_t top = kind_max(bounds_kind);
    int64_t at = 0;
    set_index(bounds, bounds_kind, 0, 0);
    for (j = 1; j <= n; j++) {
        const int64_t len = get_index(bounds, bounds_kind, j);
        if (len > top - at) return RD_EOVERFLOW; /* bounds are then partly summed */
        at += len;
        set_index(bounds, bounds_kind, j, at);
    }
    return RD_OK;
}

/*
 * What an owner sends in a round (rank_dataset.core._reference.pack_requests): for each requester
 * r < w, head bytes of `status`, then the lines of rows[at[r]:at[r]+count[r]] (numbers within its
 * slice, kind rows_kind) asked for, the line of rows[i] being src[starts[rows[i]] - lo:][:lengths[i]]
 * (starts of kind start_kind, held entries; lengths of kind len_kind, m entries, as rows: what the
 * requesters were told), back to back. sizes[0:w]: the bytes for each requester. With send NULL only
 * the sizes are computed; else send[0:send_size] must hold exactly their sum, and is filled (with
 * status != 0, the heads alone: the lines' bytes are zeros). A row not below held is RD_ERANGE (*bad
 * the index into rows) before anything is written; a line outside src, RD_ERANGE once the lines
 * before it are packed; a range of rows outside rows[0:m], RD_ERANGE with *bad -1; send of another
 * size, RD_ECAP.
 */
RD_API int rd_pack_requests(const uint8_t *src, int64_t src_size, int64_t lo, const void *starts, int start_kind,
                            const void *lengths, int len_kind, int64_t held, const void *rows, int rows_kind, int64_t m,
                            const int64_t *at, const int64_t *count, int64_t w, int64_t head, int status, uint8_t *send,
                            int64_t send_size, int64_t *sizes, int64_t *bad) {
    if (!buf_ok(src, src_size) || held < 0 || m < 0 || w < 0 || head < 0 || status < 0 || status > 255 ||
        bad == NULL || !kind_ok(start_kind) || !kind_ok(len_kind) || !kind_ok(rows_kind) || (held > 0 && !starts) ||
        (m > 0 && (!rows || !lengths)) || (w > 0 && (!at || !count || !sizes)) ||
        (send != NULL && send_size < 0))
        return RD_EARG;
    *bad = -1;
    int64_t total = 0;
    for (int64_t r = 0; r < w; r++) {
        if (at[r] < 0 || count[r] < 0 || at[r] > m - count[r]) return RD_ERANGE;
        int64_t size = head;
        for (int64_t i = at[r]; i < at[r] + count[r]; i++) {
            const int64_t row = get_index(rows, rows_kind, i);
            if (row < 0 || row >= held) {
                *bad = i;
                return RD_ERANGE;
            }
            const int64_t len = get_index(lengths, len_kind, i);
            if (len < 0 || len > INT64_MAX / 4 - size) {
                *bad = i;
                return RD_ERANGE;
            }
            size += len;
        }
        if (size > INT64_MAX / 4 - total) return RD_EOVERFLOW;
        sizes[r] = size;
        total += size;
    }
    if (send == NULL) return RD_OK;
    if (send_size != total) return RD_ECAP;
    if (status != 0) { /* the heads alone */
        memset(send, 0, (size_t)total);
        for (int64_t r = 0, d = 0; r < w; d += sizes[r], r++) memset(send + d, status, (size_t)head);
        return RD_OK;
    }
    /* One pass: each line checked as it is copied (an error leaves what was packed before it). The
     * rows are random within the slice: their starts are fetched ahead, then their bytes. */
    int64_t d = 0;
    for (int64_t r = 0; r < w; r++) {
        memset(send + d, 0, (size_t)head);
        d += head;
        const int64_t end = at[r] + count[r];
        for (int64_t i = at[r]; i < end; i++) {
            if (i + 2 * RD_PREFETCH_AHEAD < end) {
                const int64_t ahead = get_index(rows, rows_kind, i + 2 * RD_PREFETCH_AHEAD);
                RD_PREFETCH(start_kind == RD_I64 ? (const void *)((const int64_t *)starts + ahead)
                                                 : (const void *)((const uint32_t *)starts + ahead));
            }
            if (i + RD_PREFETCH_AHEAD < end) {
                const int64_t s = get_index(starts, start_kind, get_index(rows, rows_kind, i + RD_PREFETCH_AHEAD)) - lo;
                if (s >= 0 && s < src_size) RD_PREFETCH(src + s);
            }
            const int64_t row = get_index(rows, rows_kind, i), len = get_index(lengths, len_kind, i);
            const int64_t s = get_index(starts, start_kind, row);
            if (s < lo || s - lo > src_size - len) {
                *bad = i;
                return RD_ERANGE;
            }
            copy_row(send + d, src + (s - lo), len);
            d += len;
        }
    }
    return RD_OK;
}

/*
 * A requester's round placed into its shard (rank_dataset.core._reference.place_lines): got[0:got_size]
 * holds each owner o's part of parts[o] bytes, back to back: head bytes, then the lines of the items
 * order[at[o]:at[o]+count[o]] (kind order_kind), back to back; item row's line goes to
 * data[bounds[row]:bounds[row+1]] (bounds[0:n+1] of kind bounds_kind). Each row is checked as it is
 * placed (below n, its span within data, its bytes within its owner's part; the parts, first, adding
 * up to got_size): RD_ERANGE (*bad the index into order, or -1 for a part), what was placed before it
 * left as it is (the caller discards the shard). Nothing is read or written outside the buffers.
 */
RD_API int rd_place_lines(const uint8_t *got, int64_t got_size, const int64_t *parts, const void *order,
                          int order_kind, int64_t m, const int64_t *at, const int64_t *count, int64_t w, int64_t head,
                          const void *bounds, int bounds_kind, int64_t n, uint8_t *data, int64_t data_size,
                          int64_t *bad) {
    if (!buf_ok(got, got_size) || !buf_ok(data, data_size) || m < 0 || w < 0 || n < 0 || head < 0 || bad == NULL ||
        bounds == NULL || !kind_ok(order_kind) || !kind_ok(bounds_kind) || (m > 0 && !order) ||
        (w > 0 && (!parts || !at || !count)))
        return RD_EARG;
    *bad = -1;
    int64_t pos = 0;
    for (int64_t o = 0; o < w; o++) {
        if (parts[o] < head || parts[o] > got_size - pos || at[o] < 0 || count[o] < 0 || at[o] > m - count[o])
            return RD_ERANGE;
        pos += parts[o];
    }
    if (pos != got_size) return RD_ERANGE;
    /* One pass: each line checked as it is placed (an error leaves what was placed before it). The
     * rows are random within the shard: their offsets are fetched ahead, then their place. */
    const int wide = bounds_kind == RD_I64;
    pos = 0;
    for (int64_t o = 0; o < w; o++) {
        const int64_t end = pos + parts[o], stop = at[o] + count[o];
        int64_t p = pos + head;
        for (int64_t i = at[o]; i < stop; i++) {
            if (i + 2 * RD_PREFETCH_AHEAD < stop) {
                const int64_t ahead = get_index(order, order_kind, i + 2 * RD_PREFETCH_AHEAD);
                if (ahead >= 0 && ahead < n)
                    RD_PREFETCH(wide ? (const void *)((const int64_t *)bounds + ahead)
                                     : (const void *)((const uint32_t *)bounds + ahead));
            }
            if (i + RD_PREFETCH_AHEAD < stop) {
                const int64_t ahead = get_index(order, order_kind, i + RD_PREFETCH_AHEAD);
                if (ahead >= 0 && ahead < n) {
                    const int64_t d = get_index(bounds, bounds_kind, ahead);
                    if (d >= 0 && d < data_size) RD_PREFETCH_WRITE(data + d);
                }
            }
            const int64_t row = get_index(order, order_kind, i);
            if (row < 0 || row >= n) {
                *bad = i;
                return RD_ERANGE;
            }
            const int64_t d = get_index(bounds, bounds_kind, row), len = get_index(bounds, bounds_kind, row + 1) - d;
            if (d < 0 || len < 0 || d > data_size - len || len > end - p) {
                *bad = i;
                return RD_ERANGE;
            }
            copy_row(data + d, got + p, len);
            p += len;
        }
        if (p != end) return RD_ERANGE;
        pos = end;
    }
    return RD_OK;
}

/*
 * A round's lines copied from an owner's buffer straight into a shard (rank_dataset.core._reference.copy_lines):
 * the line of request[i] (one of the owner's samples: src[starts[request[i]] - lo:], starts[0:held] of
 * kind start_kind) goes to row rows[i] of the shard, data[bounds[row]:bounds[row+1]] (bounds[0:n+1] of
 * kind bounds_kind), for each i < m. Each line is checked as it is copied (its request below held, its
 * row below n, its span within src and within data): RD_ERANGE (*bad its i), what was copied before it
 * left as it is (the caller discards the shard). Nothing is read or written outside the buffers.
 */
RD_API int rd_copy_lines(const uint8_t *src, int64_t src_size, int64_t lo, const void *starts, int start_kind,
                         int64_t held, const void *request, int req_kind, const void *rows, int rows_kind, int64_t m,
                         const void *bounds, int bounds_kind, int64_t n, uint8_t *data, int64_t data_size,
                         int64_t *bad) {
    if (!buf_ok(src, src_size) || !buf_ok(data, data_size) || held < 0 || m < 0 || n < 0 || bad == NULL ||
        bounds == NULL || !kind_ok(start_kind) || !kind_ok(req_kind) || !kind_ok(rows_kind) ||
        !kind_ok(bounds_kind) || (held > 0 && !starts) || (m > 0 && (!request || !rows)))
        return RD_EARG;
    *bad = -1;
    /* The requests are random within the owner's slice and the rows within the shard: their table
     * entries are fetched two strides ahead, then the bytes they point at one stride ahead. */
    for (int64_t i = 0; i < m; i++) {
        if (i + 2 * RD_PREFETCH_AHEAD < m) {
            const int64_t q = get_index(request, req_kind, i + 2 * RD_PREFETCH_AHEAD);
            const int64_t r = get_index(rows, rows_kind, i + 2 * RD_PREFETCH_AHEAD);
            if (q >= 0 && q < held)
                RD_PREFETCH(start_kind == RD_I64 ? (const void *)((const int64_t *)starts + q)
                                                 : (const void *)((const uint32_t *)starts + q));
            if (r >= 0 && r < n)
                RD_PREFETCH(bounds_kind == RD_I64 ? (const void *)((const int64_t *)bounds + r)
                                                  : (const void *)((const uint32_t *)bounds + r));
        }
        if (i + RD_PREFETCH_AHEAD < m) {
            const int64_t q = get_index(request, req_kind, i + RD_PREFETCH_AHEAD);
            const int64_t r = get_index(rows, rows_kind, i + RD_PREFETCH_AHEAD);
            if (q >= 0 && q < held) {
                const int64_t s = get_index(starts, start_kind, q) - lo;
                if (s >= 0 && s < src_size) RD_PREFETCH(src + s);
            }
            if (r >= 0 && r < n) {
                const int64_t d = get_index(bounds, bounds_kind, r);
                if (d >= 0 && d < data_size) RD_PREFETCH_WRITE(data + d);
            }
        }
        const int64_t q = get_index(request, req_kind, i), r = get_index(rows, rows_kind, i);
        if (q < 0 || q >= held || r < 0 || r >= n) {
            *bad = i;
            return RD_ERANGE;
        }
        const int64_t s = get_index(starts, start_kind, q) - lo, d = get_index(bounds, bounds_kind, r);
        const int64_t len = get_index(bounds, bounds_kind, r + 1) - d;
        if (s < 0 || d < 0 || len < 0 || s > src_size - len || d > data_size - len) {
            *bad = i;
            return RD_ERANGE;
        }
        copy_row(data + d, src + s, len);
    }
    return RD_OK;
}

/* A verification's expected samples and progress (see rd_verify_lines). */
struct verify {
    const uint8_t *buf;
    const void *starts, *lengths;
    int start_kind, len_kind, bom;
    int64_t base, n, k, bad;
};

/* The line [s, end) (end: its newline, or the end of the buffer) compared, if it is a sample (as
 * sample() finds them), with the next expected one. */
RD_INLINE void verify_line(struct verify *v, int64_t s, int64_t end) {
    const uint8_t *buf = v->buf;
    if (v->bom && s == 0) s = 3;
    int64_t e = end;
    if (e > s && buf[e - 1] == '\r') e--;
    if (s >= e) return;
    if (buf[s] <= ' ') {
        int64_t j = s;
        while (j < e && blank(buf[j])) j++;
        if (j == e) return;
    }
    if (v->bad >= 0) return; /* (a difference found: the newlines are still counted) */
    if (v->k == v->n || get_index(v->starts, v->start_kind, v->k) - v->base != s ||
        get_index(v->lengths, v->len_kind, v->k) != e - s) {
        v->bad = v->k;
        return;
    }
    v->k++;
}

/*
 * Whether buf[0:size] (bytes offset.. of a file, starting a line; with `last` bytes after the final
 * newline form a line too) holds exactly the samples starts[k] - base, lengths[k] (k < n; kinds
 * start_kind, len_kind) that rd_scan_lines finds there: its scan, each sample compared as it is found
 * instead of stored. *bad: -1 if so, else the first sample k that differs (n: buf holds more).
 * result[0:2]: the newlines of buf, whether it is all ASCII.
 */
RD_API int rd_verify_lines(const uint8_t *buf, int64_t size, int64_t offset, int last, const void *starts,
                           int start_kind, int64_t base, const void *lengths, int len_kind, int64_t n,
                           int64_t *result, int64_t *bad) {
    if (!buf_ok(buf, size) || offset < 0 || n < 0 || result == NULL || bad == NULL || !kind_ok(start_kind) ||
        !kind_ok(len_kind) || (n > 0 && (!starts || !lengths)))
        return RD_EARG;
    struct verify v;
    v.buf = buf;
    v.starts = starts;
    v.lengths = lengths;
    v.start_kind = start_kind;
    v.len_kind = len_kind;
    v.bom = offset == 0 && size >= 3 && buf[0] == 0xEF && buf[1] == 0xBB && buf[2] == 0xBF;
    v.base = base;
    v.n = n;
    v.k = 0;
    v.bad = -1;
    uint64_t high = 0;
    int64_t line_start = 0, lines = 0, i = 0;
    for (; size - i >= 64; i += 64) {
        for (uint64_t m = mask64(buf + i, '\n', &high); m; m &= m - 1) {
            const int64_t nl = i + ctz64(m);
            verify_line(&v, line_start, nl);
            lines++;
            line_start = nl + 1;
        }
    }
    for (; i < size; i++) {
        high |= buf[i] >> 7;
        if (buf[i] == '\n') {
            verify_line(&v, line_start, i);
            lines++;
            line_start = i + 1;
        }
    }
    if (last && line_start < size) verify_line(&v, line_start, size);
    if (v.bad < 0 && v.k < n) v.bad = v.k;
    result[0] = lines;
    result[1] = high == 0;
    *bad = v.bad;
    return RD_OK;
}

/* --- two numeric fields of each line (sizes_of) --------------------------------------------------- */

/* The longest field decoded here: 10 digits (2**32 - 1 has 10); longer ones are left to the caller. */
#define RD_FIELD_DIGITS 10

/* What Python's str.split() takes as whitespace among ASCII bytes: 9-13 and 28-32. */
RD_INLINE int field_space(uint8_t c) { return (c >= 9 && c <= 13) || (c >= 28 && c <= 32); }

/* A byte after which str.split() may split differently than field_space says: a control byte it does not
 * take as whitespace (0-8, 14-27), or the lead byte of a Unicode space (U+0085, U+00A0, U+1680,
 * U+2000-U+205F, U+3000) or of a byte order mark. */
RD_INLINE int field_unsure(uint8_t c) {
    return c < 9 || (c >= 14 && c < 28) || c == 0xC2 || (c >= 0xE1 && c <= 0xE3) || c == 0xEF;
}

/* Whether this machine stores words little end first (the digits of a field are decoded in a word there). */
static int field_little_endian(void) {
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

#if !defined(__SSE2__)
/* Bit k: p[k] is below 33 or from 0x80 on (whitespace, a newline, a control or non-ASCII byte), for the 64
 * bytes p[0:64] (all readable). */
static uint64_t special64(const uint8_t *p) {
    uint64_t out = 0;
    if (field_little_endian()) {
        for (int j = 0; j < 8; j++) {
            /* Per byte, without carries between bytes: the low 7 bits + 95 reach 128 iff they are >= 33. */
            const uint64_t w = load64(p + 8 * j);
            const uint64_t high = (w | ~((w & LOWS) + ONES * 95)) & HIGHS;
            out |= (((high >> 7) * UINT64_C(0x0102040810204080)) >> 56) << (8 * j);
        }
    } else {
        for (int k = 0; k < 64; k++) out |= (uint64_t)(p[k] < 33 || p[k] >= 0x80) << k;
    }
    return out;
}
#endif

#if defined(__SSE2__)
/* special64_kinds for the 16 bytes p[16 j:16 j + 16]: their special and newline bits into *special and *newline
 * at bit 16 j; returns the odd bytes as a vector (0xFF where odd). */
RD_INLINE __m128i kinds16(const uint8_t *p, int j, uint64_t *special, uint64_t *newline) {
    const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * j));
    const __m128i s = _mm_cmplt_epi8(x, _mm_set1_epi8(33)); /* signed: below 33, or from 0x80 on */
    /* ASCII whitespace: 9-13 (x - 9, wrapping, at most 4) or a space */
    const __m128i blank = _mm_or_si128(
        _mm_cmpeq_epi8(_mm_subs_epu8(_mm_sub_epi8(x, _mm_set1_epi8(9)), _mm_set1_epi8(4)), _mm_setzero_si128()),
        _mm_cmpeq_epi8(x, _mm_set1_epi8(' ')));
    *special |= (uint64_t)(unsigned)_mm_movemask_epi8(s) << (16 * j);
    *newline |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8('\n'))) << (16 * j);
    return _mm_andnot_si128(blank, s);
}
#endif

/* Of the 64 bytes p[0:64] (all readable): bit k of *newline, p[k] is a newline; of *odd, p[k] is a special64
 * byte that is not ASCII whitespace (9-13, 32): a control byte, 28-31, or from 0x80 on. Returns special64's. */
RD_INLINE uint64_t special64_kinds(const uint8_t *p, uint64_t *newline, uint64_t *odd) {
#if defined(__SSE2__)
    uint64_t special = 0, lines = 0;
    const __m128i o0 = kinds16(p, 0, &special, &lines), o1 = kinds16(p, 1, &special, &lines);
    const __m128i o2 = kinds16(p, 2, &special, &lines), o3 = kinds16(p, 3, &special, &lines);
    *newline = lines;
    /* odd bytes are rare: their bits are gathered only where there are some */
    if (_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(o0, o1), _mm_or_si128(o2, o3)))) {
        *odd = (uint64_t)(unsigned)_mm_movemask_epi8(o0) | (uint64_t)(unsigned)_mm_movemask_epi8(o1) << 16 |
               (uint64_t)(unsigned)_mm_movemask_epi8(o2) << 32 | (uint64_t)(unsigned)_mm_movemask_epi8(o3) << 48;
    } else {
        *odd = 0;
    }
    return special;
#else
    uint64_t special = special64(p), lines = 0, blank = 0;
    for (uint64_t m = special; m; m &= m - 1) {
        const int k = ctz64(m);
        lines |= (uint64_t)(p[k] == '\n') << k;
        blank |= (uint64_t)(p[k] == ' ' || (p[k] >= 9 && p[k] <= 13)) << k;
    }
    *newline = lines;
    *odd = special & ~blank;
    return special;
#endif
}

/* The value of buf[t:e] as a field: 1 to RD_FIELD_DIGITS ASCII digits of a value in [1, 2**32), else 0. Up to
 * 8 digits in one word (with `words`: little-endian words, and 8 bytes readable before e). */
RD_INLINE uint32_t field_value(const uint8_t *buf, int64_t t, int64_t e, int words) {
    const int64_t len = e - t;
    if (len < 1 || len > RD_FIELD_DIGITS) return 0;
    if (len <= 8 && e >= 8 && words) {
        /* The word ending at the field's last byte: its bytes the high `len` ones, the first digit lowest, the
         * others 0 (leading zeros). A byte is a digit iff its xor with '0' is at most 9: below 0x80, and adding
         * 0x76 leaves it below 0x80 (a carry out of a byte follows only from a byte already found wrong). */
        const uint64_t keep = ~UINT64_C(0) << (8 * (8 - len));
        uint64_t v = (load64(buf + e - 8) ^ UINT64_C(0x3030303030303030)) & keep;
        if ((v | (v + UINT64_C(0x7676767676767676))) & HIGHS) return 0;
        v = (v * 10 + (v >> 8)) & UINT64_C(0x00FF00FF00FF00FF);
        v = (v * 100 + (v >> 16)) & UINT64_C(0x0000FFFF0000FFFF);
        v = (v * 10000 + (v >> 32)) & UINT64_C(0xFFFFFFFF);
        return (uint32_t)v; /* below 10**8 */
    }
    uint64_t value = 0;
    for (int64_t k = t; k < e; k++) {
        const unsigned d = (unsigned)buf[k] - '0';
        if (d > 9) return 0;
        value = value * 10 + d;
    }
    return value > UINT32_MAX ? 0 : (uint32_t)value;
}

/* One line's progress through its fields (fields_run). */
struct fields {
    int64_t first, second, last_field, field, token;
    uint32_t value_first, value_second;
    int ok, content, complete, words;
};

RD_INLINE void fields_reset(struct fields *f) {
    f->field = 0;
    f->token = -1;
    f->value_first = f->value_second = 0;
    f->ok = 1;
    f->content = f->complete = 0;
}

/* The field buf[t:e] ended (e: a whitespace byte, a newline or the end). */
RD_INLINE void field_end(struct fields *f, const uint8_t *buf, int64_t t, int64_t e) {
    if (f->complete) return;
    if (f->field == f->first || f->field == f->second) {
        const uint32_t value = field_value(buf, t, e, f->words);
        f->ok &= value != 0;
        if (f->field == f->first) f->value_first = value;
        if (f->field == f->second) f->value_second = value;
    }
    f->complete = f->field == f->last_field;
    f->field++;
}

/* The byte buf[i], special64's, after ordinary bytes buf[prev + 1:i]. */
RD_INLINE void field_event(struct fields *f, const uint8_t *buf, int64_t prev, int64_t i) {
    if (prev + 1 < i && f->token < 0) { /* ordinary bytes after whitespace: a field starts */
        f->token = prev + 1;
        f->content = 1;
    }
    const uint8_t c = buf[i];
    if (field_space(c)) {
        if (f->token >= 0) {
            field_end(f, buf, f->token, i);
            f->token = -1;
        }
        f->content |= c >= 28 && c <= 31; /* not ASCII whitespace */
    } else {                              /* a control or non-ASCII byte: part of a field */
        if (f->token < 0) f->token = i;
        f->content = 1;
        if (!f->complete && field_unsure(c)) f->ok = 0;
    }
}

/* The line just ended: its fields into the outputs if it is a sample. */
RD_INLINE void fields_line(struct fields *f, uint32_t *out_first, uint32_t *out_second, int64_t cap,
                           int64_t *samples, int64_t *flagged) {
    if (!f->complete) f->ok = 0; /* a field missing */
    if (f->content) {
        if (*samples < cap) {
            *flagged += !f->ok;
            out_first[*samples] = f->ok ? f->value_first : 0;
            out_second[*samples] = f->ok ? f->value_second : 0;
        }
        (*samples)++;
    }
    fields_reset(f);
}

/* rd_line_fields on buf[0:size], a run of whole lines, an event at a time: the bytes that may end a field
 * (special64's) found 64 at a time, and only they and the two fields' digits looked at. Any line (long, odd) and
 * the end of buf; result[0:2] as rd_line_fields'. */
static void fields_run(const uint8_t *buf, int64_t size, int64_t first, int64_t second, uint32_t *out_first,
                       uint32_t *out_second, int64_t cap, int64_t *result) {
    struct fields f;
    f.first = first;
    f.second = second;
    f.last_field = first > second ? first : second;
    f.words = field_little_endian();
    fields_reset(&f);
    int64_t samples = 0, flagged = 0, prev = -1;
    for (int64_t base = 0; base < size; base += 64) {
        uint64_t m = 0, newline = 0, odd = 1;
        if (size - base >= 64) {
            m = special64_kinds(buf + base, &newline, &odd);
        } else {
            for (int64_t k = 0; k < size - base; k++) m |= (uint64_t)(buf[base + k] < 33 || buf[base + k] >= 0x80) << k;
        }
        if (!odd) { /* every special byte ASCII whitespace: a field ends at one after bytes that are not */
            for (; m; m &= m - 1) {
                const int k = ctz64(m);
                const int64_t i = base + k;
                if (f.token >= 0 || prev + 1 < i) {
                    f.content = 1;
                    field_end(&f, buf, f.token >= 0 ? f.token : prev + 1, i);
                    f.token = -1;
                }
                prev = i;
                if ((newline >> k) & 1) fields_line(&f, out_first, out_second, cap, &samples, &flagged);
            }
            continue;
        }
        for (; m; m &= m - 1) {
            const int64_t i = base + ctz64(m);
            field_event(&f, buf, prev, i);
            prev = i;
            if (buf[i] == '\n') fields_line(&f, out_first, out_second, cap, &samples, &flagged);
        }
    }
    if (prev + 1 < size) { /* the last line, without a newline */
        if (f.token < 0) f.token = prev + 1;
        f.content = 1;
    }
    if (f.token >= 0) field_end(&f, buf, f.token, size);
    if (prev + 1 < size || f.content) fields_line(&f, out_first, out_second, cap, &samples, &flagged);
    result[0] = samples;
    result[1] = flagged;
}

/* The masks of buf[base:base + 128], two windows (rd_line_fields' lines of up to 64 bytes): special, newline and
 * odd bits of the first 64 bytes (s0, n0, o0) and of the next 64 (s1, n1, o1). */
struct pair {
    int64_t base;
    uint64_t s0, n0, o0, s1, n1, o1;
};

/* Make q hold position p in its first 64 bytes; 0 (q unchanged) where buf ends before its 128 bytes. The
 * windows move forward 64 bytes at a time while the lines run on, so each byte's masks are made once. */
RD_INLINE int pair_at(struct pair *q, const uint8_t *buf, int64_t size, int64_t p) {
    const int64_t off = p - q->base;
    if (off >= 0 && off < 64) return 1;
    if (off >= 64 && off < 128) {
        if (size - q->base < 192) return 0;
        q->s0 = q->s1;
        q->n0 = q->n1;
        q->o0 = q->o1;
        q->base += 64;
    } else {
        if (size - p < 128) return 0;
        q->base = p;
        q->s0 = special64_kinds(buf + p, &q->n0, &q->o0);
    }
    q->s1 = special64_kinds(buf + q->base + 64, &q->n1, &q->o1);
    return 1;
}

/* The value of the field buf[t:e] of ordinary bytes (1 or more, ASCII from 33), as field_value gives it: a field
 * of up to 8 bytes ending at or after byte 8 in one little-endian word. */
RD_INLINE uint32_t plain_value(const uint8_t *buf, int64_t t, int64_t e) {
    const int64_t len = e - t;
    if (len < 1 || len > 8 || e < 8) return field_value(buf, t, e, 1);
    /* as field_value's word */
    uint64_t v = (load64(buf + e - 8) ^ UINT64_C(0x3030303030303030)) & ~UINT64_C(0) << (8 * (8 - len));
    if ((v | (v + UINT64_C(0x7676767676767676))) & HIGHS) return 0;
    v = (v * 10 + (v >> 8)) & UINT64_C(0x00FF00FF00FF00FF);
    v = (v * 100 + (v >> 16)) & UINT64_C(0x0000FFFF0000FFFF);
    return (uint32_t)((v * 10000 + (v >> 32)) & UINT64_C(0xFFFFFFFF));
}

/* plain_value of the fields buf[t1:e1] and buf[t2:e2] (a missing one: t = e = 0, value 0), into *v1 and *v2: the
 * two decoded side by side in one vector where SSE2 has them. */
RD_INLINE void plain_values(const uint8_t *buf, int64_t t1, int64_t e1, int64_t t2, int64_t e2, uint32_t *v1,
                            uint32_t *v2) {
#if defined(__SSE2__)
    const int64_t len1 = e1 - t1, len2 = e2 - t2;
    if (len1 >= 1 && len1 <= 8 && e1 >= 8 && len2 >= 1 && len2 <= 8 && e2 >= 8) {
        /* As plain_value's words, a word a lane: their bytes digits or 0 (leading zeros), the first digit lowest. */
        const uint64_t w1 = (load64(buf + e1 - 8) ^ UINT64_C(0x3030303030303030)) & ~UINT64_C(0) << (8 * (8 - len1));
        const uint64_t w2 = (load64(buf + e2 - 8) ^ UINT64_C(0x3030303030303030)) & ~UINT64_C(0) << (8 * (8 - len2));
        __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(const void *)&w1),
                                       _mm_loadl_epi64((const __m128i *)(const void *)&w2));
        /* a byte is a digit iff it is at most 9: below 0x80, and below 0x80 with 0x76 added (bytewise) */
        if (_mm_movemask_epi8(_mm_or_si128(v, _mm_add_epi8(v, _mm_set1_epi8(0x76))))) {
            *v1 = *v2 = 0;
            return;
        }
        /* pairs of digits (the first times 10), pairs of those (times 100), of those (times 10000) */
        v = _mm_add_epi16(_mm_mullo_epi16(_mm_and_si128(v, _mm_set1_epi16(0xFF)), _mm_set1_epi16(10)),
                          _mm_srli_epi16(v, 8));
        v = _mm_madd_epi16(v, _mm_set1_epi32(0x00010064));
        v = _mm_add_epi64(_mm_mul_epu32(v, _mm_set1_epi32(10000)), _mm_srli_epi64(v, 32));
        *v1 = (uint32_t)_mm_cvtsi128_si32(v); /* below 10**8 */
        *v2 = (uint32_t)_mm_cvtsi128_si32(_mm_unpackhi_epi64(v, v));
        return;
    }
#endif
    *v1 = plain_value(buf, t1, e1);
    *v2 = plain_value(buf, t2, e2);
}

/* rd_line_fields' lines from p on while they start in the first 64 bytes of the pair q and end in it (at most 64
 * bytes, newline included) with no odd byte: read from the masks alone (every special byte is ASCII whitespace,
 * so a field starts at an ordinary byte after a special one, or at the line's start, and ends at the next special
 * one: the k-th start and the k-th end are field k's). Fields `low` and `last` (low <= last) are decoded, and
 * written as (first, second), or swapped with `swap`. Returns the position of the first line left: past the
 * first 64 bytes, or a line to be read otherwise (*stuck set). Little-endian machines only (plain_value). */
RD_INLINE int64_t pair_lines(const struct pair *q, const uint8_t *buf, int64_t p, int64_t low, int64_t last, int swap,
                             uint32_t *out_first, uint32_t *out_second, int64_t cap, int64_t *samples,
                             int64_t *flagged, int *stuck) {
    const int any_odd = (q->o0 | q->o1) != 0;
    int64_t n = *samples, bad = *flagged;
    for (int64_t off; (off = p - q->base) < 64;) {
        const int sh = (int)off;
        const uint64_t newline = q->n0 >> sh | (q->n1 << 1) << (63 - sh);
        const int nl = ctz64(newline | (UINT64_C(1) << 63));
        const uint64_t line = ~UINT64_C(0) >> (63 - nl); /* the line's bytes, newline included */
        if (!((newline >> nl) & 1) || (any_odd && ((q->o0 >> sh | (q->o1 << 1) << (63 - sh)) & line))) {
            *stuck = 1;
            break;
        }
        const uint64_t special = q->s0 >> sh | (q->s1 << 1) << (63 - sh), after = (special << 1) | 1;
        uint64_t starts = ~special & after & line, ends = special & ~after & line;
        if (starts) { /* a sample */
            int64_t k = 0;
            for (; k < low; k++) starts &= starts - 1, ends &= ends - 1;
            const int have_low = starts != 0;
            const int64_t t1 = have_low ? p + ctz64(starts) : 0, e1 = have_low ? p + ctz64(ends) : 0;
            for (; k < last; k++) starts &= starts - 1, ends &= ends - 1;
            const int have_high = have_low && starts;
            const int64_t t2 = have_high ? p + ctz64(starts) : 0, e2 = have_high ? p + ctz64(ends) : 0;
            uint32_t value_low, value_high;
            plain_values(buf, t1, e1, t2, e2, &value_low, &value_high);
            const int good = value_low && value_high; /* each 0 if its field is missing or no number */
            if (n < cap) {
                bad += !good;
                out_first[n] = good ? (swap ? value_high : value_low) : 0;
                out_second[n] = good ? (swap ? value_low : value_high) : 0;
            }
            n++;
        }
        p += nl + 1;
    }
    *samples = n;
    *flagged = bad;
    return p;
}

/*
 * Fields `first` and `second` (0-based) of each sample of buf[0:size], a run of whole lines: a line
 * ends at a newline or at the end of buf; it is a sample if it holds a byte other than ASCII
 * whitespace (space, tab, newline, CR, VT, FF), as rd_scan_lines counts them. The fields are the
 * maximal runs of bytes other than 9-13 and 28-32 (str.split()'s ASCII whitespace).
 *
 * For sample i < cap, out_first[i] and out_second[i] get the two fields' values; both get 0 (the line
 * is flagged, for the caller to judge) if the line has fewer than max(first, second) + 1 fields, holds
 * a byte field_unsure names before the end of field max(first, second), or if either field is not 1 to
 * RD_FIELD_DIGITS ASCII digits of a value in [1, 2**32). result[0:2]: the samples of buf (also those
 * past cap, which are counted but not written), the flagged samples among the first cap.
 *
 * Each byte's masks are made once, 64 bytes at a time (special64_kinds). A line of up to 64 bytes with no odd
 * byte (a control byte, 28-31, or one from 0x80 on) is read from the masks alone, with no branch on its bytes
 * (pair_lines: its fields' starts and ends as bits, the two numbers decoded side by side). From a line it
 * cannot read (longer, odd, or in the last 128 bytes of buf), the lines of the next FIELDS_RUN bytes are read an
 * event at a time (fields_run), then the masks take over again.
 */
#define FIELDS_RUN 4096
RD_API int rd_line_fields(const uint8_t *buf, int64_t size, int64_t first, int64_t second, uint32_t *out_first,
                          uint32_t *out_second, int64_t cap, int64_t *result) {
    if (!buf_ok(buf, size) || first < 0 || second < 0 || cap < 0 || result == NULL ||
        (cap > 0 && (out_first == NULL || out_second == NULL)))
        return RD_EARG;
    const int64_t low = first < second ? first : second, last = first > second ? first : second;
    const int words = field_little_endian();
    struct pair q = {-((int64_t)1 << 40), 0, 0, 0, 0, 0, 0}; /* no pair yet: the first pair_at makes one */
    int64_t samples = 0, flagged = 0, p = 0;
    while (p < size) { /* p: a line's start */
        if (words && pair_at(&q, buf, size, p)) {
            int stuck = 0;
            /* sizes_of's usual fields, 1 and 2, with constant loops and no swap */
            if (first == 1 && second == 2)
                p = pair_lines(&q, buf, p, 1, 2, 0, out_first, out_second, cap, &samples, &flagged, &stuck);
            else
                p = pair_lines(&q, buf, p, low, last, first > second, out_first, out_second, cap, &samples,
                               &flagged, &stuck);
            if (!stuck) continue;
        }
        /* the lines from p to the first newline from FIELDS_RUN bytes on (or to the end) */
        int64_t stop = size;
        if (size - p > FIELDS_RUN) {
            const uint8_t *nl = memchr(buf + p + FIELDS_RUN, '\n', (size_t)(size - p - FIELDS_RUN));
            if (nl != NULL) stop = (int64_t)(nl - buf) + 1;
        }
        const int64_t room = samples < cap ? cap - samples : 0;
        int64_t run[2];
        fields_run(buf + p, stop - p, first, second, room ? out_first + samples : NULL,
                   room ? out_second + samples : NULL, room, run);
        samples += run[0];
        flagged += run[1];
        p = stop;
    }
    result[0] = samples;
    result[1] = flagged;
    return RD_OK;
}

/* ---- rd_open_files: a batch of local files opened beneath a directory (the payloads' page-cache path) ---- */

#define RD_ENOSYS (-6) /* rd_open_files: the system has no openat2 (nothing was opened) */
#define RD_OPEN_HIT 0      /* open, its last byte in the page cache (read without waiting for a disk) */
#define RD_OPEN_MISS 1     /* open, its pages not known to be in the page cache */
#define RD_OPEN_NOT_FILE 2 /* not a regular file (closed) */

#if defined(__linux__)
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#if !defined(SYS_openat2) && (defined(__x86_64__) || defined(__aarch64__))
#define SYS_openat2 437
#endif
#if !defined(SYS_preadv2) && defined(__x86_64__)
#define SYS_preadv2 327
#endif
#if !defined(SYS_preadv2) && defined(__aarch64__)
#define SYS_preadv2 286
#endif
#endif

/* Open each of n files under the directory dirfd: names holds n paths, each ended by a NUL byte, in
 * size bytes. Each is opened with openat2(O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW,
 * RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS): a symlink inside the directory is followed, one that leaves it
 * (or an absolute one, or ".." above it) fails with EXDEV, a magic link with ELOOP; the last component
 * is never a symlink (ELOOP). A regular file is left open and its last byte read with
 * preadv2(RWF_NOWAIT) when it has at most probe_max bytes (probe_max < 0: never): a read that returns
 * says its pages are in the page cache. out (out_size >= 3n int64) gets, for file i: out[i] its
 * descriptor (-1 if none), out[n + i] its size, out[2n + i] RD_OPEN_HIT, RD_OPEN_MISS, RD_OPEN_NOT_FILE or
 * -errno (the open or fstat failed; nothing left open). The descriptors left open are the caller's.
 * Returns RD_OK; RD_EARG (bad sizes or pointers), RD_ERANGE (names is not n non-empty NUL-ended paths
 * filling size bytes), or RD_ENOSYS (no openat2 here: nothing opened). */
RD_API int rd_open_files(int dirfd, const uint8_t *names, int64_t size, int64_t n, int64_t probe_max,
                         int64_t *out, int64_t out_size) {
    if (n < 0 || !buf_ok(names, size) || !buf_ok(out, out_size) || out_size / 3 < n) return RD_EARG;
    /* the paths checked before any is opened: n pieces, each non-empty and NUL-ended, filling the buffer */
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *end = at < size ? memchr(names + at, 0, (size_t)(size - at)) : NULL;
        if (end == NULL || end == names + at) return RD_ERANGE;
        at = (int64_t)(end - names) + 1;
    }
    if (at != size) return RD_ERANGE;
#if defined(__linux__) && defined(SYS_openat2)
    struct {
        uint64_t flags, mode, resolve;
    } how; /* struct open_how (linux/openat2.h) */
    how.flags = (uint64_t)(O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    how.mode = 0;
    how.resolve = 0x08 /* RESOLVE_BENEATH */ | 0x02 /* RESOLVE_NO_MAGICLINKS */;
    at = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *name = (const char *)names + at;
        at += (int64_t)strlen(name) + 1; /* NUL-ended within size: checked above */
        out[i] = -1;
        out[n + i] = 0;
        long fd = syscall(SYS_openat2, dirfd, name, &how, sizeof how);
        if (fd < 0) {
            if (errno == ENOSYS) {
                for (int64_t j = 0; j < i; j++)
                    if (out[j] >= 0) close((int)out[j]);
                return RD_ENOSYS;
            }
            out[2 * n + i] = -(int64_t)errno;
            continue;
        }
        struct stat st;
        if (fstat((int)fd, &st) != 0) {
            out[2 * n + i] = -(int64_t)errno;
            close((int)fd);
            continue;
        }
        if (!S_ISREG(st.st_mode)) {
            out[2 * n + i] = RD_OPEN_NOT_FILE;
            close((int)fd);
            continue;
        }
        out[i] = fd;
        out[n + i] = (int64_t)st.st_size;
        int64_t status = RD_OPEN_MISS;
        if (st.st_size == 0) {
            status = RD_OPEN_HIT; /* nothing to read */
        } else if (probe_max >= 0 && (int64_t)st.st_size <= probe_max) {
#if defined(SYS_preadv2)
            uint8_t byte;
            struct iovec iov;
            iov.iov_base = &byte;
            iov.iov_len = 1;
            /* the offset as (pos_l, pos_h): a 64-bit kernel takes it whole from pos_l (pos_h shifted out) */
            const uint64_t last = (uint64_t)st.st_size - 1;
            if (syscall(SYS_preadv2, (int)fd, &iov, 1, (unsigned long)last, (unsigned long)(last >> 16 >> 16),
                        0x08 /* RWF_NOWAIT */) >= 0)
                status = RD_OPEN_HIT;
#endif
        }
        out[2 * n + i] = status;
    }
    return RD_OK;
#else
    (void)dirfd;
    (void)probe_max;
    return RD_ENOSYS;
#endif
}
