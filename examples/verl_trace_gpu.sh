#!/usr/bin/env bash
# TRACE's continuations inside verl's own rollout, end to end, on a GPU machine (untested here:
# it needs verl's Ray workers and a vLLM or SGLang server, which the CPU tests cannot run).
#
#   MODEL=/path/to/Qwen3-0.6B TRAIN=/path/train.parquet VAL=/path/val.parquet \
#   TOOLS=/path/tool_config.yaml bash examples/verl_trace_gpu.sh
#
# The parquet files are verl's RL dataset (a "prompt" column of chat messages, "agent_name" =
# tool_agent, "reward_model", "data_source"); TOOLS is verl's multi_turn tool config. Each prompt
# gets rollout.n = m(1+N) rows: m bare rollouts, then m·N continuations from their anchors' exact
# token histories, placed by the method's prefix rule (+trace.method, +trace.expansion_N). The
# trainer must be verl's legacy one (trainer.use_v1=false) with batch balancing off and the
# trace_tree estimator; the manager refuses any other setting by name.
set -euo pipefail
: "${MODEL:?set MODEL to a local Hugging Face model directory}"
: "${TRAIN:?set TRAIN to the train parquet}"
: "${VAL:?set VAL to the validation parquet}"
: "${TOOLS:?set TOOLS to the multi_turn tool config}"
PYTHON=${PYTHON:-python}
N_ROWS=${N_ROWS:-4}          # rollout.n: m(1+N) rows per prompt
EXPANSION_N=${EXPANSION_N:-1}

# the classes verl will load by name, and the predictor, before any GPU work
"$PYTHON" -c "from trace_core.integrations.verl_rollout import TraceAgentLoopManager, ContinuationAgentLoop"

exec "$PYTHON" -m verl.trainer.main_ppo \
  trainer.use_v1=false \
  trainer.balance_batch=false \
  algorithm.adv_estimator=trace_tree \
  data.train_files="$TRAIN" data.val_files="$VAL" \
  data.train_batch_size=${BATCH:-8} data.max_prompt_length=1024 data.max_response_length=2048 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.ppo_mini_batch_size=${BATCH:-8} \
  actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.rollout.name=${ENGINE:-vllm} \
  actor_rollout_ref.rollout.n="$N_ROWS" \
  actor_rollout_ref.rollout.calculate_log_probs=true \
  actor_rollout_ref.rollout.multi_turn.enable=true \
  actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOLS" \
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent \
  actor_rollout_ref.rollout.agent.agent_loop_manager_class=trace_core.integrations.verl_rollout.TraceAgentLoopManager \
  +trace.method=${METHOD:-trace} \
  +trace.expansion_N="$EXPANSION_N" \
  +trace.predictor.vocab_size=${PREDICTOR_VOCAB:-152064} \
  trainer.n_gpus_per_node=${GPUS:-1} trainer.nnodes=1 \
  trainer.total_training_steps=${STEPS:-2} trainer.val_before_train=false \
  trainer.logger='["console"]' trainer.project_name=trace-rl trainer.experiment_name=verl-trace \
  "$@"
