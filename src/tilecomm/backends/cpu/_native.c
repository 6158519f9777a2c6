/* Native runner of one rank's lowered plan over the shared-memory heap.
 *
 * The Python executor (executor.py) turns a call's template into a flat int64 *program*
 * (native.py: NativeProgram); this file runs it: the descriptor post, the copies and
 * reductions, the step flags and the bounded spin on the peers' flags, for every piece, in
 * one call from Python. It does what the executor's Python loop does, in the same order,
 * with the same flags, so ranks running either engine can meet in one collective.
 *
 * Anything slow or exceptional goes back to Python: a wait that has not finished within
 * the program's spin budget returns RUN_WAIT (Python then waits with every promise of
 * Channel.wait_slots: the timeout naming the collective, peer and sequence number, dead-peer
 * detection, the flight recorder), and the run resumes where it stopped; a descriptor that
 * differs, a peer that gave up, places other than expected return codes that Python turns
 * into the usual errors or its own path.
 *
 * Arithmetic is the executor's (NOTE [reduction order] in plan.py): operands combine left
 * to right; float16/bfloat16 accumulate in float32 and round once (nearest even); float32
 * and float64 in their own type; avg divides by the world size in the reduction that
 * completes the sum, before rounding (integers: through float64, truncated, as numpy's
 * unsafe cast does); integer sums and products wrap. Built with -ffp-contract=off so no
 * multiply-add is fused. Memory ordering: flags are stored with release and loaded with
 * acquire semantics (plain moves on x86-64, but the compiler may not reorder around them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <sched.h>
#include <time.h>
#include <errno.h>
#include <sys/types.h>
#include <sys/uio.h>

/* program header (int64 words); keep in step with native.py */
enum {
    H_PIECES, H_PIECE, H_DTYPE, H_OP, H_SCALE, H_ITEMSIZE, H_WORLD, H_RANK, H_DESC,
    H_DESC_CMP, H_NPLACES, H_SPIN, H_BUDGET_NS, H_LEN, H_NOGIL, H_REMOTE, H_DESC_ADDR
};
/* state words (int64), shared with Python */
enum { S_SEQ, S_STEP, S_K, S_PC, S_ERRNO, S_PEER, S_LEN };
/* instructions: [opcode, when, ...] */
enum { I_OP = 1, I_ADVANCE, I_WAIT, I_POSTDESC, I_HANDSHAKE, I_POSTADDR };
enum { W_ALWAYS, W_FIRST, W_NOT_FIRST, W_NOT_LAST };
/* results */
enum { RUN_DONE, RUN_WAIT, RUN_MISMATCH, RUN_ABORTED, RUN_PLACES, RUN_READ_ERROR };
/* a place: the caller's memory that peers read with process_vm_readv (plan.py PLACE_CMA) */
#define PLACE_CMA (-3)
/* dtypes (native.py: DTYPE_CODES) and ops */
enum { T_F32, T_F64, T_F16, T_BF16, T_I32, T_I64, T_U8, T_I8 };
enum { O_SUM, O_PROD, O_MIN, O_MAX, O_AVG };
/* control block slots (heap/base.py SegmentLayout) */
enum { SLOT_PROGRESS = 0, SLOT_PID = 1, SLOT_ABORT = 2 };
#define D_SEQ 0

#define BLOCK 512

/* x86-64: loops also built for AVX2, picked at load time; elsewhere the compiler's default */
#if defined(__x86_64__) && defined(__GNUC__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CLONES
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CLONES
#define CPU_RELAX() ((void)0)
#endif

static inline int64_t load_acq(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void store_rel(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- 16-bit floats ------------------------------------------------------------------- */
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;       /* NaN, as torch's scalar path */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  /* nearest even */
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {                                   /* zero or subnormal: m * 2^-24, exact */
        float v = (float)m * (1.0f / 16777216.0f);
        return bits_f32(f32_bits(v) | sign);
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}
static inline uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f), ax = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00 : 0x7c00);
    if (ax >= 0x477ff000u) return sign | 0x7c00;       /* 65520 and up round to infinity */
    if (ax < 0x38800000u) {                           /* below 2^-14: a subnormal half */
        float s = bits_f32(ax) * 16777216.0f;          /* exact: a power-of-two scale */
        return sign | (uint16_t)nearbyintf(s);         /* nearest even; 1024 is 2^-14 */
    }
    uint32_t h = ax - ((uint32_t)(127 - 15) << 23);   /* rebias; round off 13 bits */
    return sign | (uint16_t)((h + 0xfffu + ((h >> 13) & 1u)) >> 13);
}

/* ---- reductions ---------------------------------------------------------------------- */
typedef struct {
    int dtype, op;
    int64_t scale;          /* divide by this when > 0 (avg that completes) */
} RedSpec;

#define MINF(a, b) ((a) != (a) ? (a) : ((b) != (b) ? (b) : ((a) < (b) ? (a) : (b))))
#define MAXF(a, b) ((a) != (a) ? (a) : ((b) != (b) ? (b) : ((a) > (b) ? (a) : (b))))
#define MINI(a, b) ((a) < (b) ? (a) : (b))
#define MAXI(a, b) ((a) > (b) ? (a) : (b))

/* acc[i] = acc[i] (op) v[i] over one block, per accumulator type */
#define COMBINE_LOOP(T, OPEXPR)                                                   \
    for (int64_t i = 0; i < n; i++) { T a = acc[i], b = v[i]; acc[i] = (OPEXPR); }

#define COMBINE_FLOAT(NAME, T)                                                     \
    CLONES                             \
    static void NAME(T *restrict acc, const T *restrict v, int64_t n, int op) {   \
        switch (op) {                                                             \
        case O_SUM: case O_AVG: COMBINE_LOOP(T, a + b) break;                     \
        case O_PROD: COMBINE_LOOP(T, a * b) break;                                \
        case O_MIN: COMBINE_LOOP(T, MINF(a, b)) break;                            \
        default: COMBINE_LOOP(T, MAXF(a, b)) break;                               \
        }                                                                         \
    }
COMBINE_FLOAT(combine_f32, float)
COMBINE_FLOAT(combine_f64, double)

/* integers wrap on overflow (unsigned arithmetic; signed overflow would be undefined) */
#define COMBINE_INT(NAME, T, U)                                                    \
    CLONES                             \
    static void NAME(T *restrict acc, const T *restrict v, int64_t n, int op) {   \
        switch (op) {                                                             \
        case O_SUM: case O_AVG: COMBINE_LOOP(T, (T)((U)a + (U)b)) break;          \
        case O_PROD: COMBINE_LOOP(T, (T)((U)a * (U)b)) break;                     \
        case O_MIN: COMBINE_LOOP(T, MINI(a, b)) break;                            \
        default: COMBINE_LOOP(T, MAXI(a, b)) break;                               \
        }                                                                         \
    }
COMBINE_INT(combine_i32, int32_t, uint32_t)
COMBINE_INT(combine_i64, int64_t, uint64_t)

/* dst = a (op) b without a staging block (float32/64 and integers, no division): the common
 * two-operand case; dst may be a or b itself (elementwise) */
#define DIRECT_LOOP(T, OPEXPR)                                                    \
    for (int64_t i = 0; i < n; i++) { T x = a[i], y = b[i]; dst[i] = (OPEXPR); }
#define DIRECT_FLOAT(NAME, T)                                                      \
    CLONES                             \
    static void NAME(T *dst, const T *a, const T *b, int64_t n, int op) {         \
        switch (op) {                                                             \
        case O_SUM: case O_AVG: DIRECT_LOOP(T, x + y) break;                      \
        case O_PROD: DIRECT_LOOP(T, x * y) break;                                 \
        case O_MIN: DIRECT_LOOP(T, MINF(x, y)) break;                             \
        default: DIRECT_LOOP(T, MAXF(x, y)) break;                                \
        }                                                                         \
    }
DIRECT_FLOAT(direct_f32, float)
DIRECT_FLOAT(direct_f64, double)

static void widen16(float *out, const uint16_t *in, int64_t n, int bf) {
    if (bf) for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32(in[i]);
    else for (int64_t i = 0; i < n; i++) out[i] = f16_to_f32(in[i]);
}
static void narrow16(uint16_t *out, const float *in, int64_t n, int bf) {
    if (bf) for (int64_t i = 0; i < n; i++) out[i] = f32_to_bf16(in[i]);
    else for (int64_t i = 0; i < n; i++) out[i] = f32_to_f16(in[i]);
}

/* dst = ops[0] (op) ops[1] ... over n elements, block by block: each block reads every
 * operand before it writes dst, so dst may be one of the operands (an in-place reduction).
 * ``dst2`` (or NULL) receives the same values: a later copy of dst folded into the pass. */
static void reduce(const RedSpec *s, char *dst, char *dst2, char *const *ops, int nops,
                   int64_t n) {
    union { float f[BLOCK]; double d[BLOCK]; int32_t i[BLOCK]; int64_t l[BLOCK]; } acc;
    float wide[BLOCK];
    if (nops == 2 && !s->scale && (s->dtype == T_F32 || s->dtype == T_F64)) {
        int64_t isz = s->dtype == T_F32 ? 4 : 8;
        for (int64_t i0 = 0; i0 < n; i0 += 4 * BLOCK) {   /* blocks only for dst2's sake */
            int64_t m = n - i0 < 4 * BLOCK ? n - i0 : 4 * BLOCK;
            char *d = dst + isz * i0, *a = ops[0] + isz * i0, *b = ops[1] + isz * i0;
            if (s->dtype == T_F32) direct_f32((float *)d, (float *)a, (float *)b, m, s->op);
            else direct_f64((double *)d, (double *)a, (double *)b, m, s->op);
            if (dst2) memcpy(dst2 + isz * i0, d, isz * m);
        }
        return;
    }
    int64_t isz = s->dtype == T_F32 || s->dtype == T_I32 ? 4 : (s->dtype == T_F64 || s->dtype == T_I64 ? 8 : 2);
    for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {
        int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        switch (s->dtype) {
        case T_F32:
            memcpy(acc.f, ops[0] + 4 * i0, 4 * m);
            for (int j = 1; j < nops; j++) combine_f32(acc.f, (float *)(ops[j] + 4 * i0), m, s->op);
            if (s->scale) { float w = (float)s->scale; for (int64_t i = 0; i < m; i++) acc.f[i] /= w; }
            memcpy(dst + 4 * i0, acc.f, 4 * m);
            break;
        case T_F64:
            memcpy(acc.d, ops[0] + 8 * i0, 8 * m);
            for (int j = 1; j < nops; j++) combine_f64(acc.d, (double *)(ops[j] + 8 * i0), m, s->op);
            if (s->scale) { double w = (double)s->scale; for (int64_t i = 0; i < m; i++) acc.d[i] /= w; }
            memcpy(dst + 8 * i0, acc.d, 8 * m);
            break;
        case T_F16: case T_BF16: {
            int bf = s->dtype == T_BF16;
            widen16(acc.f, (uint16_t *)(ops[0] + 2 * i0), m, bf);
            for (int j = 1; j < nops; j++) {
                widen16(wide, (uint16_t *)(ops[j] + 2 * i0), m, bf);
                combine_f32(acc.f, wide, m, s->op);
            }
            if (s->scale) { float w = (float)s->scale; for (int64_t i = 0; i < m; i++) acc.f[i] /= w; }
            narrow16((uint16_t *)(dst + 2 * i0), acc.f, m, bf);
            break;
        }
        case T_I32:
            memcpy(acc.i, ops[0] + 4 * i0, 4 * m);
            for (int j = 1; j < nops; j++) combine_i32(acc.i, (int32_t *)(ops[j] + 4 * i0), m, s->op);
            if (s->scale) for (int64_t i = 0; i < m; i++) acc.i[i] = (int32_t)((double)acc.i[i] / (double)s->scale);
            memcpy(dst + 4 * i0, acc.i, 4 * m);
            break;
        default: /* T_I64 */
            memcpy(acc.l, ops[0] + 8 * i0, 8 * m);
            for (int j = 1; j < nops; j++) combine_i64(acc.l, (int64_t *)(ops[j] + 8 * i0), m, s->op);
            if (s->scale) for (int64_t i = 0; i < m; i++) acc.l[i] = (int64_t)((double)acc.l[i] / (double)s->scale);
            memcpy(dst + 8 * i0, acc.l, 8 * m);
            break;
        }
        if (dst2) memcpy(dst2 + isz * i0, dst + isz * i0, isz * m);
    }
}

/* ---- the runner ---------------------------------------------------------------------- */
#define MAX_OPS 64

typedef struct {
    const int64_t *hdr, *code;
    /* [world] segment addresses, the caller's buffers, then from H_REMOTE the peers'
     * PLACE_CMA buffers ([rank][place], filled in by the handshake) */
    int64_t *bases;
    int64_t *state;
} Run;

static inline int64_t *ctrl(const Run *r, int64_t rank) { return (int64_t *)(intptr_t)r->bases[rank]; }

/* Spin until every listed rank's progress reaches ``target``; 0 on success, 1 when the
 * program's budget ran out first (Python waits then, with timeouts and diagnostics). */
static int wait_ranks(const Run *r, const int64_t *ranks, int64_t n, int64_t target) {
    int64_t spin = r->hdr[H_SPIN], budget = r->hdr[H_BUDGET_NS], start = 0;
    for (int64_t polls = 0;; polls++) {
        int64_t j = 0;
        for (; j < n; j++)
            if (load_acq(ctrl(r, ranks[j]) + SLOT_PROGRESS) < target) break;
        if (j == n) return 0;
        if (polls < spin) { CPU_RELAX(); continue; }
        if (!start) start = now_ns();
        else if (now_ns() - start > budget) return 1;
        sched_yield();      /* ranks may outnumber cores */
    }
}

/* ---- single-copy reads of peers' memory (cma.py) ------------------------------------- */
/* read n bytes at remote address ``from`` of rank q's process into ``to``; 0 or an errno */
static int cma_read(const Run *r, int64_t q, char *to, int64_t from, int64_t n) {
    pid_t pid = (pid_t)load_acq(ctrl(r, q) + SLOT_PID);
    while (n > 0) {
        struct iovec local = {to, (size_t)n}, remote = {(void *)(intptr_t)from, (size_t)n};
        ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got <= 0) return got < 0 ? errno : EIO;
        to += got; from += got; n -= got;
    }
    return 0;
}

/* one I_OP: [I_OP, when, flags, chunk, nsrc, dst(b, off, step), [dst2(b, off, step) if
 * flags & 4], src(b, off, step) * nsrc]; flags: 1 dst is the first operand, 2 the result
 * completes the reduction (avg divides), 4 a second destination. A copy whose source is a
 * peer's PLACE_CMA buffer (base index >= H_REMOTE) reads it straight into dst with
 * process_vm_readv (peers read in place only buffers they copy: lower.py peer_reduced).
 * Returns 0 or the errno of a failed read (the peer in S_PEER). */
static int do_op(const Run *r, const int64_t *c, int64_t k) {
    const int64_t *hdr = r->hdr;
    int64_t flags = c[2], chunk = c[3], nsrc = c[4], piece = hdr[H_PIECE];
    int64_t n = piece ? chunk - k * piece : (k == 0 ? chunk : 0);
    if (piece && n > piece) n = piece;
    if (n <= 0) return 0;
    int64_t isz = hdr[H_ITEMSIZE];
    const int64_t *d = c + 5, *src = c + 8;
    char *dst = (char *)(intptr_t)(r->bases[d[0]] + d[1] + k * d[2]), *dst2 = NULL;
    if (flags & 4) {
        dst2 = (char *)(intptr_t)(r->bases[d[3]] + d[4] + k * d[5]);
        src += 3;
    }
    char *ops[MAX_OPS + 1];
    int nops = 0;
    int64_t peer = -1;              /* the peer whose PLACE_CMA buffer a source is, or -1 */
    if (flags & 1) ops[nops++] = dst;
    for (int64_t j = 0; j < nsrc && nops <= MAX_OPS; j++) {
        const int64_t *s = src + 3 * j;
        if (s[0] >= hdr[H_REMOTE]) peer = (s[0] - hdr[H_REMOTE]) / hdr[H_NPLACES];
        ops[nops++] = (char *)(intptr_t)(r->bases[s[0]] + s[1] + k * s[2]);
    }
    if (nops == 1) {            /* a copy */
        if (peer >= 0) {
            int err = cma_read(r, peer, dst, (int64_t)(intptr_t)ops[0], n * isz);
            if (err) {
                r->state[S_PEER] = peer;
                return err;
            }
        } else if (dst != ops[0]) {
            memcpy(dst, ops[0], n * isz);
        }
        if (dst2) memcpy(dst2, dst, n * isz);
        return 0;
    }
    if (peer >= 0) return EINVAL;   /* never built so (NativeProgram checks) */
    RedSpec spec = {(int)hdr[H_DTYPE], (int)hdr[H_OP], (flags & 2) ? hdr[H_SCALE] : 0};
    reduce(&spec, dst, dst2, ops, nops, n);
    return 0;
}

static int64_t instr_len(const int64_t *c) {
    switch (c[0]) {
    case I_OP: return 8 + 3 * c[4] + ((c[2] & 4) ? 3 : 0);
    case I_ADVANCE: return 2;
    case I_WAIT: return 3 + c[2];
    case I_POSTDESC: return 3 + c[2];
    case I_POSTADDR: return 3 + 2 * c[2];
    default: return 3 + c[2];          /* I_HANDSHAKE: [op, when, n, expected places...] */
    }
}

/* The handshake's check: every rank's descriptor equals ours in fields [1, desc_cmp), its
 * places equal the ones the program was built for, and no peer gave up; then the addresses
 * of the peers' PLACE_CMA buffers go into the remote bases. */
static int handshake(const Run *r, const int64_t *c) {
    const int64_t *hdr = r->hdr;
    int64_t world = hdr[H_WORLD], me = hdr[H_RANK], base = hdr[H_DESC];
    int64_t cmp = hdr[H_DESC_CMP], np = hdr[H_NPLACES];
    const int64_t *mine = ctrl(r, me) + base;
    int places_differ = 0;
    for (int64_t q = 0; q < world; q++) {
        const int64_t *d = ctrl(r, q) + base;
        if (q != me && load_acq(ctrl(r, q) + SLOT_ABORT)) return RUN_ABORTED;
        for (int64_t i = 1; i < cmp; i++)
            if (d[i] != mine[i]) return RUN_MISMATCH;
        for (int64_t i = 0; i < np; i++) {
            if (d[cmp + i] != c[3 + q * np + i]) places_differ = 1;
            else if (d[cmp + i] == PLACE_CMA && q != me)
                r->bases[hdr[H_REMOTE] + q * np + i] = d[hdr[H_DESC_ADDR] + i];
        }
    }
    return places_differ ? RUN_PLACES : RUN_DONE;
}

static int run_program(Run *r) {
    const int64_t *hdr = r->hdr, *code = r->code;
    int64_t *st = r->state, pieces = hdr[H_PIECES], len = hdr[H_LEN];
    int64_t *me = ctrl(r, hdr[H_RANK]);
    for (int64_t k = st[S_K]; k < pieces; k++) {
        for (int64_t pc = (k == st[S_K]) ? st[S_PC] : 0; pc < len; ) {
            const int64_t *c = code + pc;
            int64_t next = pc + instr_len(c), when = c[1];
            if ((when == W_FIRST && k) || (when == W_NOT_FIRST && !k) ||
                (when == W_NOT_LAST && k == pieces - 1)) { pc = next; continue; }
            switch (c[0]) {
            case I_OP: {
                int err = do_op(r, c, k);
                if (err) { st[S_ERRNO] = err; st[S_K] = k; st[S_PC] = pc; return RUN_READ_ERROR; }
                break;
            }
            case I_ADVANCE: store_rel(me + SLOT_PROGRESS, ++st[S_STEP]); break;
            case I_WAIT:
                if (wait_ranks(r, c + 3, c[2], st[S_STEP])) {
                    st[S_K] = k; st[S_PC] = pc;
                    return RUN_WAIT;
                }
                break;
            case I_POSTDESC: {
                int64_t *d = me + hdr[H_DESC];
                memcpy(d + 1, c + 4, (c[2] - 1) * 8);
                d[D_SEQ] = st[S_SEQ];
                break;
            }
            case I_POSTADDR: {          /* [op, when, n, (descriptor slot, base index) * n] */
                int64_t *d = me + hdr[H_DESC];
                for (int64_t i = 0; i < c[2]; i++) d[c[3 + 2 * i]] = r->bases[c[4 + 2 * i]];
                break;
            }
            case I_HANDSHAKE: {
                int res = handshake(r, c);
                if (res != RUN_DONE) { st[S_K] = k; st[S_PC] = next; return res; }
                break;
            }
            }
            pc = next;
        }
    }
    st[S_K] = pieces; st[S_PC] = 0;
    return RUN_DONE;
}

/* run(header, code, bases, state, seq, step) -> result code. The first four are addresses of
 * int64 arrays the caller keeps alive; seq >= 0 starts the program for call ``seq`` at flag
 * step ``step``, seq < 0 resumes it where the state says. The GIL is released while a program
 * that moves many bytes runs (H_NOGIL); a small one keeps it: releasing and taking it back
 * would cost more than the call, and its waits hand back to Python within the budget. */
static PyObject *py_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "run(header, code, bases, state, seq, step)");
        return NULL;
    }
    void *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = PyLong_AsVoidPtr(args[i]);
        if (!p[i]) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "run: null address");
            return NULL;
        }
    }
    int64_t seq = PyLong_AsLongLong(args[4]), step = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    Run r = {p[0], p[1], p[2], p[3]};
    if (seq >= 0) {
        r.state[S_SEQ] = seq; r.state[S_STEP] = step; r.state[S_K] = 0; r.state[S_PC] = 0;
    }
    int res;
    if (r.hdr[H_NOGIL]) {
        Py_BEGIN_ALLOW_THREADS
        res = run_program(&r);
        Py_END_ALLOW_THREADS
    } else {
        res = run_program(&r);
    }
    return PyLong_FromLong(res);
}

/* reduce_into(dtype, op, scale, n, dst, *srcs): one reduction over raw addresses (tests
 * compare it with the executor's numpy/torch arithmetic) */
static PyObject *py_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 6 || nargs - 4 > MAX_OPS) {
        PyErr_SetString(PyExc_TypeError, "reduce_into(dtype, op, scale, n, dst, src, ...)");
        return NULL;
    }
    RedSpec s = {(int)PyLong_AsLong(args[0]), (int)PyLong_AsLong(args[1]),
                 PyLong_AsLongLong(args[2])};
    int64_t n = PyLong_AsLongLong(args[3]);
    char *dst = PyLong_AsVoidPtr(args[4]);
    char *ops[MAX_OPS];
    int nops = 0;
    for (Py_ssize_t i = 5; i < nargs; i++) ops[nops++] = PyLong_AsVoidPtr(args[i]);
    if (PyErr_Occurred()) return NULL;
    reduce(&s, dst, NULL, ops, nops, n);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))py_run, METH_FASTCALL, "Run a plan program."},
    {"reduce_into", (PyCFunction)(void (*)(void))py_reduce, METH_FASTCALL,
     "One reduction over raw addresses."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "Native runner of lowered plans (tilecomm CPU backend).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "ABI", 1) < 0)) { Py_DECREF(m); return NULL; }
    return m;
}
