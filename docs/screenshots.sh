#!/usr/bin/env bash
# Remakes the pictures of docs/guide/viewing.md and docs/guide/watching.md from real runs:
#   bash docs/screenshots.sh
# First `cirron watch` (docs/images/watch.svg): a training whose loader is slow runs in one tmux
# pane, `cirron watch` in the other, and the watch pane, captured with its colours, is drawn as
# SVG by rich. Then the report:
# A small torch training (6 epochs, a watched model, a loss and a learning-rate mark a step, a
# validation pass an epoch) runs profiled in a temporary folder; `cirron report` draws it, and
# headless Chromium (Debian's `chromium`, which scripts/setup.sh installs) takes three
# screenshots: the top of the report, its marks, and its weights and gradients. They go to
# docs/images/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=$root/.venv/bin/python
work=$(mktemp -d)
trap 'tmux -S "$work/tmux" kill-server 2>/dev/null || true; rm -rf "$work"' EXIT

mkdir -p "$work/watched"
cat > "$work/watched/train.py" <<'EOF'
"""A classifier whose loader decodes slowly (15 ms a batch): the live view says input-bound."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import cirron as ci

ci.profile()
torch.manual_seed(0)
torch.set_num_threads(1)


class Slow(Dataset):
    def __len__(self):
        return 32 * 600

    def __getitem__(self, index):
        if index % 32 == 0:
            time.sleep(0.015)  # a slow decode, once a batch
        x = torch.randn(20)
        return x, int(x[:4].sum() > 0)


model = nn.Sequential(nn.Linear(20, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for batch, target in DataLoader(Slow(), batch_size=32):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(batch), target)
    loss.backward()
    optimizer.step()
    ci.mark("loss", loss.item())
    ci.mark("lr", optimizer.param_groups[0]["lr"])
EOF
tmux -S "$work/tmux" -f /dev/null new-session -d -x 150 -y 30 -c "$work/watched" \
    "$root/.venv/bin/cirron watch; sleep 600"
tmux -S "$work/tmux" split-window -d -c "$work/watched" "$python train.py"
sleep 14  # the view has the run's first seconds, its findings and a loss curve
tmux -S "$work/tmux" capture-pane -e -p -t 0.0 > "$work/watch.ansi"
"$python" - "$work/watch.ansi" "$root/docs/images/watch.svg" <<'PY'
import os
import sys

from rich.console import Console
from rich.text import Text

console = Console(record=True, width=150, file=open(os.devnull, "w"), force_terminal=True)
console.print(Text.from_ansi(open(sys.argv[1]).read().rstrip("\n")))
console.save_svg(sys.argv[2], title="cirron watch")
PY
echo "wrote docs/images/watch.svg"
tmux -S "$work/tmux" kill-server

chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[ -n "$chromium" ] || { echo "screenshots: needs chromium (apt-get install chromium)" >&2; exit 1; }

cat > "$work/train.py" <<'EOF'
"""A small classifier, trained for 6 epochs with a validation pass each, profiled."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cirron as ci

ci.profile()
torch.manual_seed(0)
torch.set_num_threads(1)  # a small model: one thread is the fastest, and steadiest beside other work
inputs = torch.randn(1024, 20)
labels = (inputs[:, :4].sum(dim=1) > 0).long() + 2 * (inputs[:, 4] > 0).long()
train = DataLoader(TensorDataset(inputs[:896], labels[:896]), batch_size=32, shuffle=True)
validation = DataLoader(TensorDataset(inputs[896:], labels[896:]), batch_size=64)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
ci.watch(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=6 * len(train))

for epoch in range(6):
    model.train()
    for batch, target in train:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(batch), target)
        loss.backward()
        optimizer.step()
        schedule.step()
        ci.mark("loss", loss.item())
        ci.mark("lr", schedule.get_last_lr()[0])
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(dim=1) == y).sum().item() for x, y in validation)
    ci.mark("val_accuracy", correct / 128, kind="summary")
EOF

(cd "$work" && "$python" train.py)
(cd "$work" && "$root/.venv/bin/cirron" report -o report.html)

shoot() {  # shoot OUTPUT URL HEIGHT: one screenshot of the page at URL, 1480 pixels wide
    "$chromium" --headless --no-sandbox --disable-gpu --disable-background-networking \
        --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
        --user-data-dir="$work/profile-$(basename "$1")" --virtual-time-budget=10000 \
        --window-size="1480,$3" --screenshot="$1" "$2" >/dev/null 2>&1
    echo "wrote $1 ($(du -k "$1" | cut -f1) KB)"
}
mkdir -p docs/images
shoot "$root/docs/images/report.png" "file://$work/report.html" 1000
# The lower sections: the same report cut to begin at the section (a headless screenshot can't
# scroll, a #fragment URL is taken before the charts are drawn, and charts left in the page but
# hidden lose their axis titles and legends).
section() {  # section ID OUTPUT: a screenshot from the report's section ID down
    "$python" - "$work/report.html" "$1" "$work/report-$1.html" <<'PY'
import sys

page, section, out = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
body = page.index("<body>") + len("<body>")
start = page.index(f"<h2 id='{section}'>")
open(out, "w").write(page[:body] + page[start:])
PY
    shoot "$2" "file://$work/report-$1.html" 1200
}
section marks "$root/docs/images/report-marks.png"
section snapshots "$root/docs/images/report-snapshots.png"
