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
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(_WIN32)
#define RD_API __declspec(dllexport)
#else
#define RD_API __attribute__((visibility("default")))
#endif

#define RD_OK 0
#define RD_EARG (-1)     /* a negative size, a null pointer with a size, an unknown index kind */
#define RD_ERANGE (-2)   /* a span, start or offset outside its buffer */
#define RD_ECAP (-3)     /* an output array too small */
#define RD_EOVERFLOW (-4) /* an offset too large for the offsets' type */

/* Index arrays come as int64, uint32 or int32 (the dtypes numpy callers hold). */
#define RD_I64 1
#define RD_U32 2
#define RD_I32 3

#define RD_ABI 1

RD_API int rd_abi_version(void) { return RD_ABI; }

static int kind_ok(int kind) { return kind == RD_I64 || kind == RD_U32 || kind == RD_I32; }

static int64_t get_index(const void *a, int kind, int64_t i) {
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

static int lowest_byte(uint64_t mask) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(mask) >> 3;
#else
    int k = 0;
    while (!(mask & 0x80)) {
        mask >>= 8;
        k++;
    }
    return k;
#endif
}

/* The position of each byte within a little-endian word: mask bit 8k+7 is byte k. */
static int little_endian(void) {
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/*
 * The number of bytes equal to `byte` in buf[0:size], or a negative error code.
 */
RD_API int64_t rd_count_byte(const uint8_t *buf, int64_t size, int byte) {
    if (!buf_ok(buf, size) || byte < 0 || byte > 255) return RD_EARG;
    const uint64_t pattern = ONES * (uint64_t)byte;
    int64_t count = 0, i = 0;
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
    int64_t n = 0;
    const uint8_t *p = buf, *end = buf + size;
    while (p < end) {
        const uint8_t *hit = memchr(p, byte, (size_t)(end - p));
        if (hit == NULL) break;
        if (n == cap) return RD_ECAP;
        out[n++] = hit - buf;
        p = hit + 1;
    }
    return n;
}

/* Byte -> whether it is ASCII whitespace (space, tab, newline, CR, VT, FF). */
static int blank(uint8_t c) { return c == ' ' || (c >= 9 && c <= 13); }

/*
 * The chunk scan (rank_dataset.files.scan.scan_buffer): the samples of the complete lines of
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
    int64_t n = 0, lines = 0, n_marks = 0;
    uint64_t highs = 0;
    const int bom = offset == 0 && size >= 3 && buf[0] == 0xEF && buf[1] == 0xBB && buf[2] == 0xBF;
    /* The next multiple of mark at or after offset, relative to buf. */
    int64_t target = offset % mark ? mark - offset % mark : 0;
    int64_t line_start = 0;
    const int le = little_endian();
    int64_t i = 0;
    for (;;) {
        /* Marks: every target at or before this line's start is this line's. */
        while (target <= line_start && target < size) {
            if (n_marks == marks_cap) return RD_ECAP;
            marks[2 * n_marks] = line_start + offset;
            marks[2 * n_marks + 1] = lines;
            n_marks++;
            if (target > INT64_MAX - mark) target = INT64_MAX; /* past any buffer */
            else target += mark;
        }
        /* Find this line's end: the next newline at or after i, 8 bytes at a time. */
        int64_t nl = -1;
        while (size - i >= 8) {
            uint64_t w = load64(buf + i);
            highs |= w;
            uint64_t z = zero_bytes(w ^ (ONES * 10u));
            if (z) {
                int k = le ? lowest_byte(z) : -1;
                if (k < 0) { /* big-endian: the first byte in memory order */
                    for (k = 0; buf[i + k] != '\n'; k++) {
                    }
                }
                nl = i + k;
                /* The bytes after the newline were OR-ed in already: ASCII-ness is of all bytes. */
                i += 8;
                break;
            }
            i += 8;
        }
        if (nl < 0) {
            for (; i < size; i++) {
                highs |= buf[i];
                if (buf[i] == '\n') {
                    nl = i++;
                    break;
                }
            }
        }
        /* The rest of a word past its first newline is looked at again for the next line: i moves back. */
        if (nl >= 0) i = nl + 1;
        int64_t end;
        if (nl >= 0) {
            end = nl;
            lines++;
        } else if (last && line_start < size) {
            end = size;
        } else {
            break;
        }
        int64_t s = line_start;
        if (bom && s == 0) s = 3;
        int64_t e = end;
        if (e > s && buf[e - 1] == '\r') e--;
        int keep = 0;
        for (int64_t j = s; j < e; j++) {
            if (!blank(buf[j])) {
                keep = 1;
                break;
            }
        }
        if (keep) {
            if (n == cap) return RD_ECAP;
            starts[n] = s + offset;
            lengths[n] = e - s;
            n++;
        }
        if (nl < 0) break;
        line_start = nl + 1;
    }
    /* Marks past the last line start: none (numpy's searchsorted finds no line for them). */
    result[0] = n;
    result[1] = lines;
    result[2] = (highs & HIGHS) == 0;
    result[3] = n_marks;
    return RD_OK;
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
#if defined(__GNUC__) || defined(__clang__)
        if (k + 8 < n) __builtin_prefetch(src + get_index(src_starts, src_kind, k + 8));
#endif
        int64_t len = get_index(lengths, len_kind, k);
        if (len) memcpy(dst + get_index(dst_starts, dst_kind, k), src + get_index(src_starts, src_kind, k), (size_t)len);
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
#if defined(__GNUC__) || defined(__clang__)
        if (k + 8 < n) __builtin_prefetch(src + get_index(starts, start_kind, k + 8));
#endif
        int64_t len = get_index(lengths, len_kind, k);
        if (off_kind == RD_U32) ((uint32_t *)offsets)[k] = (uint32_t)at;
        else ((int64_t *)offsets)[k] = at;
        if (len) memcpy(dst + at, src + get_index(starts, start_kind, k), (size_t)len);
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

static int utf8_valid(const uint8_t *p, int64_t len) {
    int64_t i = 0;
    while (i < len) {
        if (len - i >= 8 && !(load64(p + i) & HIGHS)) {
            i += 8;
            continue;
        }
        int k = utf8_sequence(p + i, len - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
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
    for (int64_t k = 0; k < n; k++) {
        int64_t a = get_index(bounds, kind, k), b = get_index(bounds, kind, k + 1);
        if (!utf8_valid(data + a, b - a)) {
            *row = k;
            return RD_OK;
        }
    }
    return RD_OK;
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
    for (int64_t k = 0; k < n; k++) {
        int64_t s = starts[k], e = ends[k];
        if (s < 0 || e < s || e > size) {
            *row = k;
            return RD_ERANGE;
        }
        int text = 0;
        for (int64_t j = s; j < e; j++) {
            uint8_t c = buf[j];
            if (c == '\n') {
                text = 0;
                break;
            }
            if (!blank(c)) text = 1;
        }
        if (!text) {
            *row = k;
            return RD_OK;
        }
    }
    return RD_OK;
}
