"""benchmarks/vs_verl.py's equal-gradients check, run both ways on a tiny model: verl 0.9.1's own engine
update and arctic-rl's engine with ZoRRo Train agree (loss, gradients and one optimizer step's weight change,
on three ragged prompt groups whose old log-probs are near the model's); with ZoRRo deliberately broken in one
row only (--break-zorro one-row: the response positions of the row with the most negative advantage off by
one, a row the earlier check's random old log-probs clipped out of the gradient) the check fails and nothing
is timed."""

from __future__ import annotations

import os
import subprocess
import sys

from repo_paths import REPO


def _check(out, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "benchmarks" / "vs_verl.py"), "--check-only", "--workloads", "tiny"]
    cmd += ["--variants", "verl,arctic+zorro", "--out", str(out), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _row(stdout: str, variant: str) -> list[str]:
    """The check table's row of `variant` (table rows are indented)."""
    return next(line.split() for line in stdout.splitlines() if line.startswith("  ") and line.split()[0] == variant)


def test_equal_gradients_check_passes_and_fails_when_zorro_is_broken(tmp_path):
    good, broken = _check(tmp_path / "good"), _check(tmp_path / "broken", "--break-zorro", "one-row")  # at once
    (good_out, good_err), (broken_out, broken_err) = good.communicate(), broken.communicate()
    assert good.returncode == 0, good_out + good_err[-3000:]
    assert "equal loss, gradients and optimizer update (vs verl, tolerance 0.0001, update 0.001; " in good_out
    assert "model's): passed" in good_out
    assert _row(good_out, "arctic+zorro")[-1] == "yes"
    assert broken.returncode == 1, broken_out + broken_err[-3000:]
    assert "FAILED" in broken_out and "nothing timed" in broken_out
    assert _row(broken_out, "arctic+zorro")[-1] == "NO"
    assert _row(broken_out, "verl")[-1] == "yes"


def test_prefix_grouper_shim_runs_the_unpadded_prefix_call_causal_without_a_mask():
    """flash_mask_sdpa (the shim that lets PrefixGrouper's flash-attn-style calls reach SDPA): its prefix call with
    nothing padded goes to SDPA with no mask (causal, as flash-attn runs it: the masked half skipped) and equals
    the explicit causal mask; a padded call still takes the 4-D mask (bottom-right causal over valid keys)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    sys.path.insert(0, str(REPO / "benchmarks"))
    import vs_verl

    seen = []

    def spy(module, q, k, v, mask, *a, **kw):
        seen.append(mask)
        return sdpa_attention_forward(module, q, k, v, mask, *a, **kw)

    class Layer(torch.nn.Module):
        is_causal = True
        num_key_value_groups = 1

    attention, layer = vs_verl.flash_mask_sdpa(spy), Layer()
    q, k, v = (torch.randn(2, 4, 37, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    out, _ = attention(layer, q, k, v, torch.ones(2, 37, dtype=torch.long))
    assert seen[-1] is None
    causal = torch.ones(37, 37, dtype=torch.bool).tril()[None, None].expand(2, 1, 37, 37)
    ref, _ = sdpa_attention_forward(layer, q, k, v, causal)
    torch.testing.assert_close(out, ref)
    padded = torch.ones(2, 37, dtype=torch.long)
    padded[0, :5] = 0  # a shorter prompt, left-padded
    attention(layer, q, k, v, padded)
    assert seen[-1] is not None and seen[-1].shape == (2, 1, 37, 37)
    assert not seen[-1][0, 0, :, :5].any()  # no query sees the padding
