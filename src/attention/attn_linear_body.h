/* The linear-attention sweeps for one element type, included by attn_linear.c with T (float or
 * double) and SUF (f32 or f64) defined. State and row buffers are T: the same arithmetic as the
 * tensors', so a float32 call runs 4- or 8-wide. Every loop over a row is an axpy (the states
 * are kept in the orientation that makes it one), so the compiler vectorises it without
 * reassociating a sum; the only dot products are d long (denominators) per row. */
#define LIN_CAT2(a, b) a##_##b
#define LIN_CAT(a, b) LIN_CAT2(a, b)
#define LIN(name) LIN_CAT(name, SUF)

/* row x (n entries, stride s) through phi into out; dphi (optional) gets phi'(x) */
static void LIN(load_phi)(const T *x, int64_t s, int64_t n, int feature, T *out, T *dphi) {
  for (int64_t c = 0; c < n; c++) {
    T t = x[c * s];
    if (feature == ATTN_LINEAR_ELU1) {
      T e = t > 0 ? (T)1 : (T)exp(t);
      out[c] = t > 0 ? t + 1 : e;
      if (dphi) dphi[c] = e;
    } else {
      out[c] = t;
      if (dphi) dphi[c] = 1;
    }
  }
}

static void LIN(load)(const T *x, int64_t s, int64_t n, T *out) {
  for (int64_t c = 0; c < n; c++) out[c] = x[c * s];
}

static T LIN(dot)(const T *a, const T *b, int64_t n) {
  T s = 0;
  for (int64_t c = 0; c < n; c++) s += a[c] * b[c];
  return s;
}

/* y += alpha x */
static void LIN(axpy)(T *restrict y, T alpha, const T *restrict x, int64_t n) {
  for (int64_t c = 0; c < n; c++) y[c] += alpha * x[c];
}

/* M (rows x cols) += u v^T */
static void LIN(rank1)(T *M, const T *u, const T *w, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) LIN(axpy)(M + r * cols, u[r], w, cols);
}

/* y = sum_r u[r] M[r, :] (+ y0 when given) */
static void LIN(combo)(T *y, const T *u, const T *M, int64_t rows, int64_t cols, const T *y0, T y0s) {
  for (int64_t c = 0; c < cols; c++) y[c] = y0 ? y0s * y0[c] : 0;
  for (int64_t r = 0; r < rows; r++) LIN(axpy)(y, u[r], M + r * cols, cols);
}

static void LIN(forward_item)(const lin_ctx *x, int64_t b, T *ws) {
  int64_t Nq = x->Nq, Nk = x->Nk, d = x->d, dv = x->dv;
  const T *Q = (const T *)x->q + b * x->qs[0], *K = (const T *)x->k + b * x->ks[0];
  const T *V = (const T *)x->v + b * x->vs[0];
  T *O = (T *)x->out_w + b * Nq * dv;
  T *S = ws, *z = S + d * dv, *a = z + d, *c = a + d, *vr = c + d;
  for (int64_t t = 0; t < d * dv + d; t++) S[t] = 0;
  int feat = x->o.feature;
  T eps = (T)x->o.eps;
  if (!x->o.causal)
    for (int64_t j = 0; j < Nk; j++) {
      LIN(load_phi)(K + j * x->ks[1], x->ks[2], d, feat, c, NULL);
      LIN(load)(V + j * x->vs[1], x->vs[2], dv, vr);
      LIN(rank1)(S, c, vr, d, dv);
      LIN(axpy)(z, 1, c, d);
    }
  for (int64_t i = 0; i < Nq; i++) {
    if (x->o.causal) {
      LIN(load_phi)(K + i * x->ks[1], x->ks[2], d, feat, c, NULL);
      LIN(load)(V + i * x->vs[1], x->vs[2], dv, vr);
      LIN(rank1)(S, c, vr, d, dv);
      LIN(axpy)(z, 1, c, d);
    }
    LIN(load_phi)(Q + i * x->qs[1], x->qs[2], d, feat, a, NULL);
    T den = LIN(dot)(a, z, d) + eps;
    LIN(combo)(O + i * dv, a, S, d, dv, NULL, 0);
    for (int64_t e = 0; e < dv; e++) O[i * dv + e] /= den;
  }
}

/* Workspace entries of one backward item: ST (dv x d), R (d x dv), RT (dv x d), z, r, a, da,
 * dphi, c, dc, then vr, gn, gr, or (dv each), then gd (Nq) when causal. */
static void LIN(backward_item)(const lin_ctx *x, int64_t b, T *ws) {
  int64_t Nq = x->Nq, Nk = x->Nk, d = x->d, dv = x->dv;
  const T *Q = (const T *)x->q + b * x->qs[0], *K = (const T *)x->k + b * x->ks[0];
  const T *V = (const T *)x->v + b * x->vs[0];
  const T *O = (const T *)x->out + b * x->os[0], *G = (const T *)x->g + b * x->gs[0];
  T *DQ = (T *)x->dq + b * Nq * d, *DK = (T *)x->dk + b * Nk * d, *DV = (T *)x->dv_out + b * Nk * dv;
  T *ST = ws, *R = ST + dv * d, *RT = R + d * dv, *z = RT + dv * d, *r = z + d, *a = r + d, *da = a + d;
  T *dphi = da + d, *c = dphi + d, *dc = c + d, *vr = dc + d, *gn = vr + dv, *gr = gn + dv, *orow = gr + dv;
  T *gd_all = orow + dv;
  for (int64_t t = 0; t < 3 * d * dv + 2 * d; t++) ST[t] = 0;
  int feat = x->o.feature, causal = x->o.causal;
  T eps = (T)x->o.eps;
  /* sweep 1: queries in order with the running (or total) ST, z: dq, and (not causal) R, r */
  if (!causal)
    for (int64_t j = 0; j < Nk; j++) {
      LIN(load_phi)(K + j * x->ks[1], x->ks[2], d, feat, c, NULL);
      LIN(load)(V + j * x->vs[1], x->vs[2], dv, vr);
      LIN(rank1)(ST, vr, c, dv, d);
      LIN(axpy)(z, 1, c, d);
    }
  for (int64_t i = 0; i < Nq; i++) {
    if (causal) {
      LIN(load_phi)(K + i * x->ks[1], x->ks[2], d, feat, c, NULL);
      LIN(load)(V + i * x->vs[1], x->vs[2], dv, vr);
      LIN(rank1)(ST, vr, c, dv, d);
      LIN(axpy)(z, 1, c, d);
    }
    LIN(load_phi)(Q + i * x->qs[1], x->qs[2], d, feat, a, dphi);
    LIN(load)(G + i * x->gs[1], x->gs[2], dv, gr);
    LIN(load)(O + i * x->os[1], x->os[2], dv, orow);
    T den = LIN(dot)(a, z, d) + eps;
    T gd = -LIN(dot)(gr, orow, dv) / den;
    for (int64_t e = 0; e < dv; e++) gn[e] = gr[e] / den;
    LIN(combo)(da, gn, ST, dv, d, z, gd);
    for (int64_t t = 0; t < d; t++) DQ[i * d + t] = da[t] * dphi[t];
    if (causal) { /* parked for the reverse sweep */
      for (int64_t e = 0; e < dv; e++) DV[i * dv + e] = gn[e];
      gd_all[i] = gd;
    } else {
      LIN(rank1)(R, a, gn, d, dv);
      LIN(rank1)(RT, gn, a, dv, d);
      LIN(axpy)(r, gd, a, d);
    }
  }
  /* sweep 2: keys in reverse with the suffix sums R, r (or the totals): dk, dv */
  for (int64_t j = Nk - 1; j >= 0; j--) {
    if (causal) {
      for (int64_t e = 0; e < dv; e++) gn[e] = DV[j * dv + e];
      LIN(load_phi)(Q + j * x->qs[1], x->qs[2], d, feat, a, NULL);
      LIN(rank1)(R, a, gn, d, dv);
      LIN(rank1)(RT, gn, a, dv, d);
      LIN(axpy)(r, gd_all[j], a, d);
    }
    LIN(load_phi)(K + j * x->ks[1], x->ks[2], d, feat, c, dphi);
    LIN(load)(V + j * x->vs[1], x->vs[2], dv, vr);
    LIN(combo)(dc, vr, RT, dv, d, r, 1);
    for (int64_t t = 0; t < d; t++) DK[j * d + t] = dc[t] * dphi[t];
    LIN(combo)(DV + j * dv, c, R, d, dv, NULL, 0);
  }
}

/* Items [begin, end) with one workspace for the chunk; a failed allocation flags the context. */
static void LIN(each_item)(lin_ctx *x, int64_t begin, int64_t end, void (*item)(const lin_ctx *, int64_t, T *)) {
  size_t cap;
  T *ws = attn_alloc(x->ws_entries * sizeof(T), &cap);
  if (!ws) {
    atomic_store(&x->failed, 1);
    return;
  }
  for (int64_t b = begin; b < end; b++) item(x, b, ws);
  attn_free(ws, cap);
}

static void LIN(forward_task)(void *ctx, int64_t begin, int64_t end) {
  LIN(each_item)(ctx, begin, end, LIN(forward_item));
}

static void LIN(backward_task)(void *ctx, int64_t begin, int64_t end) {
  LIN(each_item)(ctx, begin, end, LIN(backward_item));
}

#undef LIN
#undef LIN_CAT
#undef LIN_CAT2
