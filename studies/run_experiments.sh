#!/usr/bin/env bash
# Every experiment of the paper on the study models (studies/train_models.sh), into studies/results/.
# Usage: bash studies/run_experiments.sh [snli|enfr|cola|glue|deen|speed]...   (default: all)
# Each command resumes if interrupted (rerun the same line). Subsets of the test sets keep a sweep
# within minutes on 2 CPU cores; the sizes are in each run's results.json signature.
set -euo pipefail
cd "$(dirname "$0")/.."
D=${HEADPRUNE_SHARED_DATA:-../shared/data}
R=studies/results
HP="python -m headprune"
targets=("$@")
has() { [ ${#targets[@]} -eq 0 ] || [[ " ${targets[*]} " == *" $1 "* ]]; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

SNLI="runs/snli-minilm/final --task classification --data $D/snli/test.jsonl.gz"
if has snli; then  # BERT-on-MNLI stand-in: Table 1 / Fig. 1, Table 3, Table 6, Fig. 3
  $HP ablate $SNLI --limit 1000 -o $R/snli_ablation
  $HP all-but-one $SNLI --limit 500 -o $R/snli_all_but_one
  $HP all-but-one $SNLI --limit 500 --choose-data $D/snli/train_20k.jsonl.gz -o $R/snli_all_but_one_heldout
  $HP curve $SNLI --limit 500 --calib-data $D/snli/train_20k.jsonl.gz --oracle-from $R/snli_ablation --seeds 2 \
    -o $R/snli_curve
fi

MT="runs/multi30k-en-fr-small/final --task translation --limit 120"
T16="--data $D/multi30k/test_2016_flickr.en.gz --data2 $D/multi30k/test_2016_flickr.fr.gz"
T17="--data-b $D/multi30k/test_2017_mscoco.en.gz --data2-b $D/multi30k/test_2017_mscoco.fr.gz"
VAL="$D/multi30k/val.en.gz"; VAL2="$D/multi30k/val.fr.gz"
if has enfr; then  # WMT stand-in: Table 1 (three kinds), Table 2, Table 5, Fig. 2, Fig. 3, Fig. 4
  $HP ablate $MT $T16 -o $R/enfr_ablation
  $HP all-but-one $MT $T16 -o $R/enfr_all_but_one
  $HP all-but-one $MT $T16 --choose-data $VAL --choose-data2 $VAL2 -o $R/enfr_all_but_one_heldout
  $HP cross-domain $MT $T16 $T17 --names flickr2016,mscoco2017 -o $R/enfr_cross_domain
  $HP curve $MT $T16 --calib-data $VAL --calib-data2 $VAL2 --seeds 2 --oracle-from $R/enfr_ablation -o $R/enfr_curve
  for kind in encoder decoder cross; do
    $HP curve $MT $T16 --calib-data $VAL --calib-data2 $VAL2 --orders importance --kind $kind -o $R/enfr_curve_$kind
  done
fi

if has cola; then  # the MNLI-m vs -mm analogue of Fig. 2: CoLA in-domain vs out-of-domain dev (Matthews)
  $HP cross-domain runs/cola-minilm/final --task classification --metric matthews \
    --data $D/cola/cola_public_v1.1/dev_in_domain.tsv --data-b $D/cola/cola_public_v1.1/dev_out_of_domain.tsv \
    --names in-domain,out-of-domain -o $R/cola_cross_domain
fi

if has glue; then  # App. B, Fig. 6: SST-2 (accuracy), CoLA (Matthews), MRPC (F1)
  $HP curve runs/sst2-minilm/final --task classification --data $D/sst2/dev.tsv --calib-data $D/sst2/train.tsv --limit 872 --orders importance,random --seeds 2 -o $R/sst2_curve
  $HP curve runs/cola-minilm/final --task classification --metric matthews --data $D/cola/dev.tsv --calib-data $D/cola/train.tsv --limit 1043 --orders importance,random --seeds 2 -o $R/cola_curve
  $HP curve runs/mrpc-minilm/final --task classification --metric f1 --data $D/mrpc/dev.tsv --calib-data $D/mrpc/train.tsv --limit 408 --orders importance,random --seeds 2 -o $R/mrpc_curve
fi

if has deen; then  # IWSLT stand-in, paper 6 / Fig. 5: the I_h curve at every epoch
  $HP dynamics runs/deen-6x8/epoch-* --task translation --data $D/multi30k/test_2016_flickr.de.gz \
    --data2 $D/multi30k/test_2016_flickr.en.gz --limit 150 \
    --calib-data $D/multi30k/train.de.gz --calib-data2 $D/multi30k/train.en.gz -o $R/deen_dynamics
fi

if has speed; then  # Table 4: examples/s of BERT-base shape, 50% of heads removed
  python benchmarks/pruned_speed.py
fi
exit 0
