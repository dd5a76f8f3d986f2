"""Standalone reproductions of the attention wrong results the matrix found (docs/upstream-wrong-results.md).

Only torch and flashinfer; float64 torch is the truth. Run on a GPU: `python fi_attention_boundaries.py`.
Each line: the case, the kernel path, the largest error of the output on rows that see keys, of the rows
that see none (truth 0), and of the lse (truth -inf for a row with no key: reported as the kernel's value).
"""

import math
import sys

import flashinfer
import torch

DEV, BF16, I32 = "cuda", torch.bfloat16, torch.int32
H, KV, D = 32, 8, 128
SCALE = 1.0 / math.sqrt(D)
WS = torch.empty(512 << 20, dtype=torch.uint8, device=DEV)


def truth(q, k, v, causal):
    """q [Lq, H, D], k/v [Lk, KV, D] -> out [Lq, H, D] and natural-log lse [Lq, H], float64."""
    lq, lk = q.shape[0], k.shape[0]
    kk = k.double().repeat_interleave(H // KV, dim=1)
    vv = v.double().repeat_interleave(H // KV, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * SCALE
    if causal:
        i = torch.arange(lq, device=DEV)[:, None]
        s = s.masked_fill(torch.arange(lk, device=DEV)[None, :] > i + (lk - lq), -math.inf)
    seen = torch.isfinite(s).any(-1)  # [H, Lq]
    lse = torch.logsumexp(s, -1)
    p = torch.where(seen[..., None], torch.softmax(s.masked_fill(~seen[..., None], 0.0), -1), 0.0)
    out = torch.einsum("hqk,khd->qhd", p, vv)
    return out, lse.T, seen.T


def report(name, out, lse, qs, ks, causal):
    """FlashInfer (0.5.3 to 0.6.6 at least) returns a base-2 lse: compared in natural log."""
    errs_seen, errs_unseen, lse_err, worst_unseen_lse = 0.0, 0.0, 0.0, None
    for (q0, q1), (k0, k1) in zip(qs, ks, strict=True):
        o, want_lse, seen = truth(Q[q0:q1], K[k0:k1], V[k0:k1], causal)
        got_o, got_l = out[q0:q1].double(), lse[q0:q1].double() * math.log(2.0)
        if seen.any():
            errs_seen = max(errs_seen, float((got_o - o)[seen].abs().max()))
            lse_err = max(lse_err, float((got_l - want_lse)[seen].abs().max()))
        if (~seen).any():
            errs_unseen = max(errs_unseen, float(got_o[~seen].abs().max()))
            top = float(got_l[~seen].max())
            worst_unseen_lse = top if worst_unseen_lse is None else max(worst_unseen_lse, top)
    print(f"{name:58s} out err (rows with keys) {errs_seen:9.3g}  out |.| (rows without) {errs_unseen:9.3g}  "
          f"lse err {lse_err:9.3g}  lse of rows without keys {worst_unseen_lse}", flush=True)


def indptr(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=I32, device=DEV)


def decode(far_negative: bool):
    global Q, K, V
    lens = [16, 40, 7]
    Q = torch.randn(len(lens), H, D, dtype=BF16, device=DEV)
    K = torch.randn(sum(lens), KV, D, dtype=BF16, device=DEV)
    V = torch.randn(sum(lens), KV, D, dtype=BF16, device=DEV)
    if far_negative:  # raw q . k about -65536: every score of every row below -5e4
        Q[..., 0], K[..., 0] = 256.0, -256.0
    kv_indptr = indptr(lens)
    for tc in (False, True):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD", use_tensor_cores=tc)
        w.plan(kv_indptr, torch.arange(sum(lens), dtype=I32, device=DEV), torch.ones(len(lens), dtype=I32, device=DEV),
               H, KV, D, 1, q_data_type=BF16, kv_data_type=BF16, sm_scale=SCALE)
        out, lse = w.run(Q, (K[:, None], V[:, None]), return_lse=True)
        qs = [(b, b + 1) for b in range(len(lens))]
        ks = [(int(kv_indptr[b]), int(kv_indptr[b + 1])) for b in range(len(lens))]
        report(f"decode far_negative={far_negative} tensor_cores={tc}", out, lse, qs, ks, False)


def prefill(case: str, backend: str):
    """Ragged prefill; `far_negative`: every raw score below -5e4; `masked`: causal with more queries than keys;
    `masked_medium`: the lengths of gqa_ragged_prefill_causal_h32_kv8_d128's medium fully_masked_rows case, which
    0.7.2.post1's fa2 failed in the matrix (two requests with more queries than keys, one over 148 keys)."""
    global Q, K, V
    gen = torch.Generator().manual_seed(0)
    kv_lens = torch.randint(1, 257, (16,), generator=gen).tolist()
    qo_lens = [k + 8 for k in kv_lens] if case == "masked" else [min(k, 64) for k in kv_lens]
    if case == "masked_medium":
        qo_lens, kv_lens = [25, 20, 122], [1, 148, 104]
    Q = torch.randn(sum(qo_lens), H, D, dtype=BF16, device=DEV)
    K = torch.randn(sum(kv_lens), KV, D, dtype=BF16, device=DEV)
    V = torch.randn(sum(kv_lens), KV, D, dtype=BF16, device=DEV)
    if case == "far_negative":
        Q[..., 0], K[..., 0] = 256.0, -256.0
    qi, ki = indptr(qo_lens), indptr(kv_lens)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(WS, "NHD", backend=backend)
    w.plan(qi, ki, H, KV, D, causal=True, sm_scale=SCALE, q_data_type=BF16, kv_data_type=BF16)
    out, lse = w.run(Q, K, V, return_lse=True)
    qs = [(int(qi[b]), int(qi[b + 1])) for b in range(len(qo_lens))]
    ks = [(int(ki[b]), int(ki[b + 1])) for b in range(len(kv_lens))]
    report(f"ragged prefill causal {case} backend={backend}", out, lse, qs, ks, True)


if __name__ == "__main__":
    torch.manual_seed(0)
    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name(), flush=True)
    for far in (False, True):
        decode(far)
    for case in ("typical", "far_negative", "masked", "masked_medium"):
        for backend in ("fa2", "fa3"):
            try:
                prefill(case, backend)
            except Exception as e:  # noqa: BLE001
                print(f"ragged prefill {case} backend={backend}: {type(e).__name__}: {e}", file=sys.stderr)
