#!/usr/bin/env bash
# The standard measurements of a GPU lease, in one call of the device tool (about 9 minutes):
#   run(command="bash benchmarks/h200_session.sh", timeout_s=600)
# Each step writes under $OUT (the device tool brings those files back) and has its own
# time limit, so one slow step costs only itself. Steps (pick with STEPS="tests bench ..."):
#   tests     the gpu-marked tests (Triton target, CUDA graphs, layouts, random)
#   opinfo    OpInfo on CUDA in float32, float16 and bfloat16, one sample per (op, dtype):
#             ~650 Triton compiles, a call of its own (STEPS=opinfo)
#   bench     issue 7's table: kernels and the five models, eager / ember / torch.compile
#   compile   issue 7's compile times: the five models, cold and warm (a second process),
#             eager / ember / torch.compile (about 6 minutes)
#   frontend  frontend tests under the machine's Python 3.12
#   libs      issue 9's library suites (timm, hf, torchvision) in bfloat16: 38 models take
#             about 14 minutes with torch.compile's column, more than one call's 10, so
#   libs-timm, libs-hf, libs-torchvision   run one suite each (a call apiece)
#   recheck   the library models the last sessions changed Ember's speed on (RECHECK_MODELS:
#             swin_t, convnext_tiny, the LM heads, alexnet), with torch.compile: ~5 minutes
#   train     issue 10's AMP training step (float32 weights, bf16 autocast): ~7 minutes; or
#             only TRAIN_MODELS (e.g. TRAIN_MODELS=resnet50: ~2 minutes)
#   survey    issue 8's model survey (CPU, Python 3.12): inference and training
#   launch    per-call and per-launch cost of a one-kernel function (issue 7: <= 5 us)
#   warm      resnet50's cold and warm start in two processes (issue 7: warm < 1 s)
#   trainprof resnet50's AMP training step: wall, host and GPU time, top kernels, host
#             profile; Ember NCHW and channels-last, torch.compile (issue 10)
#   dropout   BERT-base and GPT-2 AMP training with dropout 0.1: gradients against eager under
#             one seed (masks replayed from the saved generator state), time, memory
#   gaps-train, gaps-infer   issue 34's remaining gaps beside torch.compile, profiled (top
#             kernels, busy time): the AMP training steps of GPT-2 and vit_base; bf16
#             inference of maxvit_tiny_rw_224, vit_tiny and DeBERTa (up to 4.5 minutes each)
#   stencil   depthwise convolutions as generated stencils against the library's, in one
#             process (benchmarks/depthwise_stencil.py: maxvit, mobilenetv3, efficientnet_b0,
#             convnext_tiny; taps 0, 25, 49): about 4 minutes
#   partition AMP training steps (resnet50, vit_base, gpt2) with the partition saving library
#             calls' inputs or recomputing them (benchmarks/partition_trade.py): up to 8 minutes
#   bnsplit   batch norm + ReLU training steps at resnet50's shapes under several split limits
#             and column tiles, eager and torch.compile beside (benchmarks/bn_split.py): ~3 min
#   column    Triton column-sum tiles beside eager and torch.compile (column_reduction.py)
#   profile   top CUDA kernels (bf16), Ember and eager, in both layouts, of the models where
#             Ember trails (PROFILE_MODELS: default mobilenetv3_large_100, whose
#             reduce-overhead run is 1.72x against torch.compile's 2.53x, convnext_tiny
#             and vit_base)
set -u
export HF_HUB_OFFLINE=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
# the GPU machine lacks expecttest (torch's OpInfo database imports it): copy its package
# from this machine's venv into .gpu/pylib/ and pass carry=[".gpu"]
[ -d .gpu/pylib ] && PYTHONPATH=$PYTHONPATH:$PWD/.gpu/pylib
OUT=${OUT:-/tmp/h200}
mkdir -p "$OUT"
# the machine sets PYTHONDONTWRITEBYTECODE=1: give Ember the bytecode an install would have
# (otherwise every process compiles its modules from source, a fifth of a warm start)
python3 -m compileall -q ember > /dev/null
STEPS=${STEPS:-"tests bench frontend"}
COMPILERS=${COMPILERS:-eager,ember,ember-reduce-overhead,torch-inductor,torch-inductor-reduce-overhead}
for step in $STEPS; do
  case $step in
    tests) timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu \
             --ignore=tests/backend/opinfo/test_opinfo_cuda.py > "$OUT/gpu_tests.txt" 2>&1 ;;
    opinfo) EMBER_OPINFO_K=1 EMBER_OPINFO_REPORT=$OUT/opinfo_cuda.json timeout 540 python3 -m pytest -q \
             -p no:cacheprovider -m gpu tests/backend/opinfo/test_opinfo_cuda.py \
             > "$OUT/opinfo.txt" 2>&1 ;;
    bench) timeout 300 python3 -m ember.bench --device cuda --suite kernels,gpu --dtype bfloat16 \
             --compilers $COMPILERS --repeat 10 --warmup 3 --no-warm-compile --timeout 200 \
             --torch-compile-budget 60 --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1 ;;
    compile) timeout 420 python3 -m ember.bench --device cuda --suite gpu --dtype bfloat16 \
             --compilers eager,ember,torch-inductor --repeat 10 --warmup 3 --timeout 200 \
             --torch-compile-budget 60 --json "$OUT/compile.json" > "$OUT/compile.txt" 2>&1 ;;
    frontend) timeout 100 python3 -m pytest -q -p no:cacheprovider tests/frontend \
             > "$OUT/frontend312.txt" 2>&1 ;;
    libs|libs-timm|libs-hf|libs-torchvision)
          suites=${step#libs-}; [ "$step" = libs ] && suites=timm,hf,torchvision
          timeout 540 python3 -m ember.bench --suite $suites --device cuda \
             --dtype bfloat16 --compilers eager,ember,torch-inductor --repeat 10 --warmup 3 \
             --timeout 150 --torch-compile-budget 90 --no-warm-compile --budget 500 \
             --out "$OUT/$step" > "$OUT/$step.txt" 2>&1 ;;
    recheck) timeout 420 python3 -m ember.bench --models ${RECHECK_MODELS:-swin_t,convnext_tiny,GPT2LMHeadModel,BertForMaskedLM,WhisperForConditionalGeneration,alexnet} \
             --device cuda --dtype bfloat16 --compilers eager,ember,torch-inductor --repeat 10 \
             --warmup 3 --timeout 150 --torch-compile-budget 90 --no-warm-compile --budget 400 \
             --out "$OUT/recheck" > "$OUT/recheck.txt" 2>&1 ;;
    train) timeout 420 python3 -m ember.bench --device cuda --mode train --amp \
             $([ -n "${TRAIN_MODELS:-}" ] && echo "--models $TRAIN_MODELS" || echo "--suite gpu") \
             --compilers eager,ember,torch-inductor --repeat 10 --warmup 3 \
             --no-warm-compile --torch-compile-budget 90 > "$OUT/train.txt" 2>&1 ;;
    survey) (timeout 280 python3 tests/frontend/model_libraries/survey_models.py;
             timeout 280 python3 tests/frontend/model_libraries/survey_models.py --train) \
             > "$OUT/survey.txt" 2>&1 ;;
    launch) timeout 60 python3 benchmarks/launch_overhead.py > "$OUT/launch.txt" 2>&1 ;;
    warm) timeout 90 python3 benchmarks/warm_start.py resnet50 > "$OUT/warm.txt" 2>&1 ;;
    trainprof) timeout 300 python3 benchmarks/train_profile.py resnet50 --torch-compile \
             --layouts auto,channels_last --cprofile > "$OUT/trainprof.txt" 2>&1 ;;
    dropout) timeout 200 python3 benchmarks/dropout_train.py > "$OUT/dropout.txt" 2>&1 ;;
    gaps-train) timeout 270 python3 benchmarks/profile_models.py GPT2LMHeadModel,vit_base \
             --train --iters 10 --rows 22 --out "$OUT/gaps-train.md" > "$OUT/gaps-train.txt" 2>&1 ;;
    gaps-infer) timeout 270 python3 benchmarks/profile_models.py \
             maxvit_tiny_rw_224,vit_tiny,DebertaV2ForMaskedLM --iters 10 --rows 16 \
             --out "$OUT/gaps-infer.md" > "$OUT/gaps-infer.txt" 2>&1 ;;
    stencil) timeout 400 python3 benchmarks/depthwise_stencil.py > "$OUT/stencil.txt" 2>&1 ;;
    partition) timeout 500 python3 benchmarks/partition_trade.py > "$OUT/partition.txt" 2>&1 ;;
    bnsplit) timeout 400 python3 benchmarks/bn_split.py > "$OUT/bnsplit.txt" 2>&1 ;;
    column) timeout 200 python3 benchmarks/column_reduction.py > "$OUT/column.txt" 2>&1 ;;
    profile) (for layout in auto channels_last; do timeout 200 python3 \
             benchmarks/profile_models.py ${PROFILE_MODELS:-mobilenetv3_large_100,convnext_tiny,vit_base} \
             --eager --rows 12 --layout $layout --no-torch-compile; done) > "$OUT/profile.txt" 2>&1 ;;
    *) echo "unknown step $step" >&2 ;;
  esac
  echo "== $step: $(tail -n 1 "$OUT"/*"$step"*.txt 2>/dev/null | tail -n 1)"
done
