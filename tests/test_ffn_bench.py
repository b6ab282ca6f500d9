import subprocess
import sys


def test_ffn_bench_smoke_on_cpu(tmp_path):
    out = tmp_path / "rows.csv"
    cmd = [sys.executable, "-m", "bench.ffn", "--shapes", "128,32,128", "--reps", "2", "--csv", str(out)]
    cmd += ["--sparsity", "venom", "--sparsity", '{"activations": "16:2:8"}']
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = out.read_text().splitlines()
    assert len(lines) == 1 + 4 * 3 + 3  # header, 4 providers x 3 modes, 3 mask parts
    assert any(line.startswith('128x32x128,"sparse {""activations"": ""16:2:8""}",full') for line in lines)
    assert "speedup_vs_best_dense" in done.stdout and "git" in lines[0]
    bad = subprocess.run([sys.executable, "-m", "bench.ffn", "--shapes", "1,2"], capture_output=True, text=True)
    assert bad.returncode != 0 and "T,d,h" in bad.stderr


def test_weight_grad_quality_smoke(tmp_path):
    out = tmp_path / "q.csv"
    cmd = [sys.executable, "-m", "bench.weight_grad_quality", "--train-steps", "2", "--batch-size", "2"]
    cmd += ["--patterns", "tokens:1:2:4", "--dense-fracs", "1.0", "--csv", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = out.read_text().splitlines()
    assert len(rows) == 1 + 2  # dW1 and dW2 rows
    # dense_frac=1 keeps every hidden unit exact: the approximation equals exact
    assert all(abs(float(r.split(",")[3]) - 1.0) < 1e-5 for r in rows[1:]), rows
