//! PyTorch training the CLI's 2D U-Net on digit canvases by `mirra train`'s recipe, in a
//! `python3` subprocess, beside `cargo xtask accuracy`'s U-Net row (`--torch`): what the
//! same network reaches on the same task in the same number of steps, so that a miss of
//! the Dice target says whether mirra or the task is short.
//!
//! The same as mirra's run: the network (three levels of two 3x3 convolutions without bias
//! of 16, 32 and 64 filters, batch norm and relu, 2x2 max pooling, a bottleneck of two of
//! 128, nearest upsampling, concatenation of the skip, a 1x1 convolution to 11 classes:
//! 487,883 parameters), the data (canvases of 2 to 4 digits pasted at random on 56x56,
//! pixels above 127 labelled `1 + digit`, a later digit winning, the image the brighter
//! pixel; half as many training canvases per epoch as training digits, fresh ones every
//! epoch, and half as many validation canvases, of the validation digits), pixels / 255,
//! per-pixel cross-entropy, Adam with cosine decay to 0 over every step, batch norm with
//! Keras's momentum (0.99) and epsilon (1e-3), and the Dice over the ten digit classes of
//! every validation pixel. What differs: PyTorch's weight initialisation, NumPy's random
//! numbers (other canvases of the same distribution), channels-first layout.
//!
//! It also reports where the errors lie on the validation canvases, by how many digits'
//! strokes cover a pixel (background, one digit, two or more), and two ceilings of the
//! task: the Dice of an oracle that knows every digit but gives each pixel where strokes
//! overlap to the first digit there rather than the last (wrong on overlaps unless the two
//! digits share a class), and of one that is right on a pixel that `k` digits' strokes
//! cover with probability `1/k` (a guess of the winner) and gives it to the first digit
//! otherwise.

use std::ffi::OsString;
use std::path::Path;

use serde_json::Value;

use crate::torch_train::run_script;

/// The script: argv = data_dir full(0/1) epochs batch lr cosine(0/1) threads seed;
/// prints one line per epoch on stderr and one JSON line.
const SCRIPT: &str = r#"
import gzip, json, os, sys, time
data_dir, full, epochs, batch = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
lr, cosine, threads, seed = float(sys.argv[5]), sys.argv[6] == "1", int(sys.argv[7]), int(sys.argv[8])
try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:
    print(json.dumps({"error": "torch does not import: %s" % e}), flush=True)
    sys.exit(0)
torch.set_num_threads(threads)
torch.manual_seed(seed)

def idx(name):
    for n in (name, name + ".gz", name.replace("-idx", ".idx", 1), name.replace("-idx", ".idx", 1) + ".gz"):
        p = os.path.join(data_dir, n)
        if os.path.isfile(p):
            raw = open(p, "rb").read()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            nd = raw[3]
            dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
            return np.frombuffer(raw, np.uint8, offset=4 + 4 * nd).reshape(dims)
    print(json.dumps({"error": "no %s in %s" % (name, data_dir)}), flush=True)
    sys.exit(0)

test = (idx("t10k-images-idx3-ubyte"), idx("t10k-labels-idx1-ubyte"))
if full:
    train, val = (idx("train-images-idx3-ubyte"), idx("train-labels-idx1-ubyte")), test
else:
    train, val = (test[0][:8000], test[1][:8000]), (test[0][8000:], test[1][8000:])

def canvases(digits, count, rng):
    x, y = digits
    img = np.zeros((count, 56, 56), np.uint8)
    last = np.zeros((count, 56, 56), np.uint8)
    first = np.zeros((count, 56, 56), np.uint8)
    covers = np.zeros((count, 56, 56), np.uint8)
    chance = np.zeros((count, 56, 56), np.float64)
    for i in range(count):
        for _ in range(rng.integers(2, 5)):
            d = rng.integers(0, len(y)); t, l = rng.integers(0, 29, 2)
            p, c = x[d], y[d] + 1
            img[i, t:t + 28, l:l + 28] = np.maximum(img[i, t:t + 28, l:l + 28], p)
            on = p > 127
            last[i, t:t + 28, l:l + 28][on] = c
            f = first[i, t:t + 28, l:l + 28]
            f[on & (f == 0)] = c
            covers[i, t:t + 28, l:l + 28] += on
    return img, last, first, covers

def dice(pred, truth):
    scores = []
    for c in range(1, 11):
        p, t = pred == c, truth == c
        s = p.sum() + t.sum()
        if s > 0:
            scores.append(2 * (p & t).sum() / s)
    return float(np.mean(scores))

vimg, vmask, vfirst, vcovers = canvases(val, (len(val[1]) + 1) // 2, np.random.default_rng(seed ^ 0x7E57))

def cbr(i, o):
    return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o, eps=1e-3, momentum=0.01), nn.ReLU()]

class UNet(nn.Module):
    def __init__(self, filters=(16, 32, 64, 128)):
        super().__init__()
        self.enc, c = nn.ModuleList(), 1
        for f in filters[:-1]:
            self.enc.append(nn.Sequential(*cbr(c, f), *cbr(f, f))); c = f
        self.mid = nn.Sequential(*cbr(c, filters[-1]), *cbr(filters[-1], filters[-1])); c = filters[-1]
        self.dec = nn.ModuleList()
        for f in reversed(filters[:-1]):
            self.dec.append(nn.Sequential(*cbr(c + f, f), *cbr(f, f))); c = f
        self.out = nn.Conv2d(c, 11, 1)
    def forward(self, x):
        skips = []
        for e in self.enc:
            x = e(x); skips.append(x); x = F.max_pool2d(x, 2)
        x = self.mid(x)
        for d in self.dec:
            x = F.interpolate(x, scale_factor=2, mode="nearest")
            x = d(torch.cat([x, skips.pop()], 1))
        return self.out(x)

net = UNet()
params = sum(p.numel() for p in net.parameters())
per_epoch = (len(train[1]) + 1) // 2
steps = epochs * ((per_epoch + batch - 1) // batch)
opt = torch.optim.Adam(net.parameters(), lr=lr, eps=1e-7)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=0.0) if cosine else None
vx = torch.tensor(vimg, dtype=torch.float32)[:, None] / 255
history, started = [], time.time()
for epoch in range(epochs):
    t0 = time.time()
    img, mask, _, _ = canvases(train, per_epoch, np.random.default_rng([seed, epoch]))
    x = torch.tensor(img, dtype=torch.float32)[:, None] / 255
    y = torch.tensor(mask, dtype=torch.long)
    order = torch.randperm(per_epoch)
    net.train()
    total = 0.0
    for s in range(0, per_epoch, batch):
        b = order[s:s + batch]
        loss = F.cross_entropy(net(x[b]), y[b])
        opt.zero_grad(); loss.backward(); opt.step()
        if sched:
            sched.step()
        total += loss.item() * len(b)
    net.eval()
    with torch.no_grad():
        pred = torch.cat([net(vx[i:i + batch]).argmax(1) for i in range(0, len(vx), batch)]).numpy()
    history.append({"epoch": epoch + 1, "loss": total / per_epoch, "val_dice": dice(pred, vmask)})
    print("pytorch unet: epoch %d/%d %.0fs loss %.4f val_dice %.4f" % (epoch + 1, epochs, time.time() - t0, total / per_epoch, history[-1]["val_dice"]), file=sys.stderr, flush=True)

def errors(where):
    n = int(where.sum())
    return {"pixels": n, "error": float((pred[where] != vmask[where]).mean()) if n else None}

one = vcovers == 1
rng = np.random.default_rng(seed)
# A guess among the digits whose strokes cover a pixel: right with probability 1/k.
guess = vmask.copy()
wrong = (vcovers > 1) & (rng.random(vmask.shape) >= 1.0 / np.maximum(vcovers, 1))
guess[wrong] = vfirst[wrong]
print(json.dumps({
    "params": params, "steps": steps, "seconds": time.time() - started,
    "val_dice": history[-1]["val_dice"], "history": history,
    "errors": {"background": errors(vcovers == 0), "one_digit": errors(one), "overlap": errors(vcovers > 1),
               "one_digit_called_background": float(((pred == 0) & one).sum() / max(one.sum(), 1)),
               "one_digit_called_another_digit": float(((pred != 0) & (pred != vmask) & one).sum() / max(one.sum(), 1))},
    "ceilings": {"first_digit_wins_overlaps": dice(vfirst, vmask), "chance_on_overlaps": dice(guess, vmask)},
}), flush=True)
"#;

/// PyTorch's U-Net trained on canvases of the MNIST in `data` (`full`: its training
/// digits, validated on its test digits; else the test set split 8,000 / 2,000) for
/// `epochs` at `batch` with Adam from `lr` (under cosine decay to 0 when `cosine`), on
/// `threads` threads: the script's JSON (`val_dice`, `history`, `errors`, `ceilings`).
#[allow(clippy::too_many_arguments)]
pub fn measure(
    data: &Path,
    full: bool,
    epochs: usize,
    batch: u64,
    lr: f64,
    cosine: bool,
    threads: usize,
    seed: u64,
) -> Result<Value, String> {
    let args: Vec<OsString> = vec![
        data.into(),
        if full { "1" } else { "0" }.into(),
        epochs.to_string().into(),
        batch.to_string().into(),
        lr.to_string().into(),
        if cosine { "1" } else { "0" }.into(),
        threads.to_string().into(),
        seed.to_string().into(),
    ];
    run_script(SCRIPT, &args, Some(threads))
}
