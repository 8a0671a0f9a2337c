r"""Mutation check of the test suite: each mutant breaks one promise of lnjax in a copy of
the repository, and the tests that pin that promise must fail on it.

  python tests/mutants.py                 # every mutant; exit 1 if any survived
  python tests/mutants.py --only NAME     # one (or a comma-separated few)
  python tests/mutants.py --list          # names, files and the tests that should kill each

A mutant is a textual find/replace on one file (the pattern must occur exactly once, so a
refactoring that moves the code fails loudly here instead of silently testing nothing).
For each mutant, lnjax/, tests/, configs/ and pyproject.toml are copied to a temporary
folder (the real tree is never modified; the tests read their corpora from tests/fixtures,
copied with them), the mutation applied there, and only the named tests run in the copy
(`pytest -x -q`, PYTHONPATH at the copy). A failing test kills the mutant; passing tests
let it survive; a pattern no longer in its file is an error. Every mutant must be killed.
"""

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPIED = ("lnjax", "tests", "configs", "benchmarks", "experiments", "pyproject.toml")


@dataclasses.dataclass(frozen=True)
class Mutant:
  name: str
  path: str  # File, relative to the repository root.
  find: str  # Occurs exactly once in the file.
  replace: str
  tests: tuple[str, ...]  # pytest ids, relative to the repository root.
  what: str  # The promise broken, in words.


M = Mutant
MUTANTS = [
    # ---- Models: placements, norms, masks.
    M("post_ln_norm_inside_residual", "lnjax/models/placement.py",
      'return norm("norm")(x + dropout(sublayer(x)))  # x = LN(x + F(x))',
      'return x + dropout(norm("norm")(sublayer(x)))  # x = LN(x + F(x))',
      ("tests/test_models.py::test_post_ln_formula",),
      "Post-LN's norm moved inside the residual: x + LN(F(x))"),
    M("pre_ln_final_norm_dropped", "lnjax/models/placement.py",
      "    return _norm(cfg, name)(x)\n  if cfg.norm_position == \"resi_dual\":",
      "    return x\n  if cfg.norm_position == \"resi_dual\":",
      ("tests/test_models.py::test_pre_ln_formula_and_final_norm",),
      "Pre-LN's final norm dropped"),
    M("causal_mask_shifted_by_one", "lnjax/models/layers.py",
      "jnp.tril(jnp.ones((t, t), dtype=bool))", "jnp.tril(jnp.ones((t, t), dtype=bool), 1)",
      ("tests/test_models.py::test_causality",),
      "the causal mask lets each position see the next one"),
    M("layernorm_gamma_dropped", "lnjax/models/norms.py",
      "jnp.sqrt(var + self.eps)) * gamma_D + beta_D", "jnp.sqrt(var + self.eps)) + beta_D",
      ("tests/test_models.py::test_layernorm_and_rmsnorm_formulas_with_random_parameters",
       "tests/test_models.py::test_post_ln_formula"),
      "LayerNorm ignores its gain γ"),
    M("layernorm_beta_dropped", "lnjax/models/norms.py",
      "jnp.sqrt(var + self.eps)) * gamma_D + beta_D", "jnp.sqrt(var + self.eps)) * gamma_D",
      ("tests/test_models.py::test_layernorm_and_rmsnorm_formulas_with_random_parameters",
       "tests/test_models.py::test_pre_ln_formula_and_final_norm"),
      "LayerNorm ignores its bias β"),
    M("rmsnorm_g_dropped", "lnjax/models/norms.py",
      "jnp.sqrt(ms + self.eps)) * g_D)", "jnp.sqrt(ms + self.eps)))",
      ("tests/test_models.py::test_layernorm_and_rmsnorm_formulas_with_random_parameters",),
      "RMSNorm ignores its gain g"),
    M("normformer_mid_norm_before_activation", "lnjax/models/layers.py",
      """    h_BxTxF = act(h_BxTxF)
    if self.gated:
      h_BxTxF = h_BxTxF * hidden(dense(self.d_ff, ("embed", "mlp"), "wi_up")(x_BxTxD))
    if self.mid_norm is not None:
      h_BxTxF = self.mid_norm(name="mid_norm")(h_BxTxF)
""", """    if self.mid_norm is not None:
      h_BxTxF = self.mid_norm(name="mid_norm")(h_BxTxF)
    h_BxTxF = act(h_BxTxF)
    if self.gated:
      h_BxTxF = h_BxTxF * hidden(dense(self.d_ff, ("embed", "mlp"), "wi_up")(x_BxTxD))
""",
      ("tests/test_placements.py::test_normformer_head_scales_and_extra_norms",),
      "NormFormer's FFN norm N_f before the activation instead of after it"),
    M("normformer_attention_input_norm_dropped", "lnjax/models/placement.py",
      'y = sublayer(norm("norm")(x))  # with N_f', 'y = sublayer(norm("norm")(x) if name == "ffn" else (norm("norm")(x), x)[1])  # with N_f',
      ("tests/test_placements.py::test_normformer_head_scales_and_extra_norms",),
      "NormFormer's attention reads x instead of N(x)"),
    M("sandwich_cross_attention_norms_swapped", "lnjax/models/placement.py",
      'return x + dropout(norm("out_norm")(sublayer(norm("norm")(x))))  # x + N_out(F(N_in(x)))',
      'n_in, n_out = ("out_norm", "norm") if name == "cross_attn" else ("norm", "out_norm")\n'
      '    return x + dropout(norm(n_out)(sublayer(norm(n_in)(x))))',
      ("tests/test_placements.py::test_sandwich_decoder_norms_around_self_and_cross_attention",),
      "Sandwich's cross-attention uses its output norm as input norm and vice versa"),
    M("deepnorm_cross_attention_without_alpha", "lnjax/models/placement.py",
      'return norm("norm")(alpha * x + dropout(sublayer(x)))  # x = LN(α·x + F(x))',
      'return norm("norm")((1.0 if name == "cross_attn" else alpha) * x + dropout(sublayer(x)))',
      ("tests/test_placements.py::test_deepnorm_encoder_decoder_residuals_and_cross_attention",),
      "DeepNorm's cross-attention residual without α: LN(x + F(x))"),
    M("tied_output_reads_the_scaled_embedding", "lnjax/models/transformer.py",
      "return x_BxTxD @ self.embedding.T.astype(self.cfg.dtype)",
      "return x_BxTxD @ (self.embedding * self.cfg.d_model**0.5).T.astype(self.cfg.dtype)",
      ("tests/test_models.py::test_tied_embeddings_share_the_matrix",),
      "the tied output projection is √D·E, not the embedding E itself"),
    # ---- Schedules.
    M("cosine_schedule_is_linear", "lnjax/core/optim.py",
      "decay = optax.cosine_decay_schedule(peak, after_w, alpha=cfg.end_learning_rate / peak)",
      "decay = optax.linear_schedule(peak, cfg.end_learning_rate, after_w)",
      ("tests/test_optim.py::test_schedule_values_against_closed_forms",),
      "the cosine schedule decays linearly"),
    M("constant_schedule_decays_to_zero", "lnjax/core/optim.py",
      "decay = optax.constant_schedule(peak)", "decay = optax.linear_schedule(peak, 0.0, after_w)",
      ("tests/test_optim.py::test_schedule_values_against_closed_forms",
       "tests/test_optim.py::test_constant_schedule_without_warmup_is_constant"),
      "the constant schedule decays to 0 over the run"),
    M("warmup_off_by_one_step", "lnjax/core/optim.py",
      "warmup = optax.linear_schedule(0.0, peak, w)",
      "warmup = lambda t: optax.linear_schedule(0.0, peak, w)(t + 1)",
      ("tests/test_optim.py::test_schedule_values_against_closed_forms",),
      "warm-up one step ahead: lr(t) = (t + 1)/W · peak"),
    # ---- Source padding.
    M("encoder_source_padding_unmasked", "lnjax/models/transformer.py",
      "return stack(self.cfg, x_BxSxD, layers.padding_bias(src_BxS > 0),",
      "return stack(self.cfg, x_BxSxD, jnp.zeros((1, 1, 1, 1)),",
      ("tests/test_decode.py::test_padded_source_encodes_and_scores_as_the_sentence_alone",
       "tests/test_decode.py::test_padded_source_trains_and_decodes_as_the_sentence_alone"),
      "the encoder's self-attention attends to padded source positions"),
    M("cross_attention_source_padding_unmasked", "lnjax/models/transformer.py",
      "layers.padding_bias(src_BxS > 0), deterministic=deterministic, decode=decode,",
      "jnp.zeros((1, 1, 1, 1)), deterministic=deterministic, decode=decode,",
      ("tests/test_decode.py::test_padded_source_encodes_and_scores_as_the_sentence_alone",
       "tests/test_decode.py::test_padded_source_trains_and_decodes_as_the_sentence_alone"),
      "the decoder's cross-attention attends to padded source positions"),
    M("beam_length_penalty_inverted", "lnjax/inference/decode.py",
      "return logp / (length.astype(jnp.float32) ** length_penalty)",
      "return logp / (length.astype(jnp.float32) ** -length_penalty)",
      ("tests/test_decode.py::test_beam_finds_the_best_sequence_when_all_can_be_enumerated",),
      "beam search scores log p · length^α instead of log p / length^α"),
    # ---- The training loop and its exits.
    M("label_smoothing_ignored", "lnjax/core/build.py",
      "label_smoothing=run.train.label_smoothing", "label_smoothing=0.0",
      ("tests/test_train.py::test_label_smoothing_changes_the_update",),
      "train.label_smoothing never reaches the train step"),
    M("resume_skips_the_data_iterator_state", "lnjax/core/train.py",
      "    train_iter.set_state(data_state)\n", "    pass\n",
      ("tests/test_train.py::test_resume_reproduces_the_uninterrupted_run",),
      "a resumed run reads its data from the start again"),
    M("nan_loss_not_divergence", "lnjax/core/hooks.py",
      "if not math.isfinite(loss) or loss > self.max_loss:",
      "if loss > self.max_loss:",
      ("tests/test_train.py::test_divergence_exits_with_code_3",),
      "a NaN loss does not end the run"),
    M("divergence_exit_code_0", "lnjax/main.py",
      '"diverged": 3', '"diverged": 0',
      ("tests/test_train.py::test_divergence_exits_with_code_3",),
      "a diverged run exits 0"),
    M("resume_skips_the_data_iterator_state_bert", "lnjax/core/train.py",
      "    train_iter.set_state(data_state)\n", "    pass\n",
      ("tests/test_bert.py::test_bert_resume_reproduces_the_uninterrupted_run",),
      "a resumed BERT run reads its sentence pairs from the start again"),
    # ---- GLUE fine-tuning.
    M("glue_finetune_loss_ascends", "lnjax/tasks/glue.py",
      "  return loss_sum, nll_sum, count", "  return -loss_sum, -nll_sum, count",
      ("tests/test_bert.py::test_smoke_finetune_loss_falls_and_reports_accuracy_f1_and_intervals",),
      "fine-tuning climbs its loss instead of descending it"),
    M("glue_finetune_labels_ignored", "lnjax/tasks/glue.py",
      'batch["labels"][:, None],', 'jnp.zeros_like(batch["labels"])[:, None],',
      ("tests/test_bert.py::test_smoke_finetune_loss_falls_and_reports_accuracy_f1_and_intervals",),
      "fine-tuning fits class 0 whatever the label"),
    # ---- Translation runs.
    M("resume_skips_the_data_iterator_state_translation", "lnjax/core/train.py",
      "    train_iter.set_state(data_state)\n", "    pass\n",
      ("tests/test_translation.py::test_translation_resume_reproduces_the_uninterrupted_run",),
      "a resumed translation run reads its batches from the start again"),
    M("predict_default_is_the_latest_checkpoint", "lnjax/core/averaging.py",
      'folder = "best_checkpoint" if kind == "best" else "checkpoints"',
      'folder = "checkpoints"',
      ("tests/test_translation.py::test_predict_mode_writes_and_scores_hypotheses",),
      "--mode=predict decodes the latest checkpoint when asked for the best"),
    # ---- Sweeps.
    M("sweep_run_overrides_dropped", "lnjax/sweep/launcher.py",
      "for k, v in {**self.fixed, **run.overrides}.items()]]",
      "for k, v in self.fixed.items()]]",
      ("tests/test_sweep.py::test_dry_run_prints_each_runs_command_and_launches_nothing",),
      "every run of a sweep is launched with the base config"),
    M("sweep_devices_per_run_ignored", "lnjax/sweep/launcher.py",
      "per_run = devices_per_run or len(devices) // parallel",
      "per_run = len(devices) // parallel",
      ("tests/test_sweep.py::test_devices_per_run_sizes_each_slot",),
      "--devices_per_run has no effect"),
    M("sweep_run_lock_shared", "lnjax/sweep/launcher.py",
      "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
      "fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)",
      ("tests/test_sweep.py::test_a_run_of_a_killed_launcher_is_never_started_twice",),
      "a relaunch starts a run that a killed launcher's process still trains"),
    M("summary_baseline_renamed", "lnjax/core/train.py",
      '"unigram_baseline": self.b.data.unigram_entropy,',
      '"unigram_baseline_nats": self.b.data.unigram_entropy,',
      ("tests/test_sweep.py::test_killed_sweep_finishes_on_relaunch_without_redoing_finished_runs",),
      "summary.json names the unigram baseline otherwise than the sweep report reads it"),
    # ---- 2024-25 placements (issue 30)
    M("dyt_alpha_ignored", "lnjax/models/norms.py",
      "f(alpha * x_BxTxD.astype(jnp.float32))", "f(x_BxTxD.astype(jnp.float32))",
      ("tests/test_placements.py::test_dyt_replaces_every_norm_by_a_scaled_tanh",),
      "DyT (and Derf) ignore the learned α: γ ⊙ tanh(x) + β"),
    M("lns_scaled_by_total_depth", "lnjax/models/placement.py",
      "norm(\"norm\")(x) / math.sqrt(index + 1)", "norm(\"norm\")(x) / math.sqrt(cfg.num_layers)",
      ("tests/test_placements.py::test_layernorm_scaling_scales_each_norm_output_by_one_over_sqrt_depth",),
      "LayerNorm Scaling divides by √L (the depth) instead of √ℓ (the layer's index + 1)"),
    M("olmo2_norm_on_the_input", "lnjax/models/placement.py",
      "return x + dropout(norm(\"norm\")(sublayer(x)))  # x = x + N(F(x))",
      "return x + dropout(sublayer(norm(\"norm\")(x)))  # x = x + N(F(x))",
      ("tests/test_placements.py::test_olmo2_norms_each_sublayer_output_with_qk_norm_and_normal_init",),
      "OLMo 2's norm on the sub-layer's input (Pre-LN) instead of its output"),
    M("ngpt_matrices_not_renormalized", "lnjax/core/optim.py",
      "return new / jnp.linalg.norm(new, axis=axis, keepdims=True) - p", "return u",
      ("tests/test_placements.py::test_ngpt_matrices_stay_on_the_unit_sphere",),
      "nGPT's matrices leave the unit sphere after an optimizer step"),
    M("ngpt_softmax_scale_inverse", "lnjax/models/layers.py",
      "(k_h**0.5 if self.unit_qk is not None else scale)", "(scale)",
      ("tests/test_placements.py::test_ngpt_block_on_the_unit_sphere",),
      "nGPT's attention scales q kᵀ by 1/√d_h instead of √d_h"),
    # ---- The modern block (issue 59) and the 2025 placements (issue 61).
    M("gqa_kv_heads_tiled", "lnjax/models/layers.py",
      "k_BxHxSxK = jnp.repeat(k_BxGxSxK, h // g, axis=1)",
      "k_BxHxSxK = jnp.tile(k_BxGxSxK, (1, h // g, 1, 1))",
      ("tests/test_block_options.py::test_gqa_equals_multi_head_attention_with_repeated_key_value_weights",),
      "GQA's key heads tiled (head j serving query heads j, j+G, ...) instead of repeated"),
    M("rope_decode_at_position_zero", "lnjax/models/layers.py",
      "offset = self._cache_index() if decode else 0", "offset = 0",
      ("tests/test_decode.py::test_cached_decoding_of_the_modern_block_equals_the_full_forward_pass",),
      "incremental decoding rotates every new q and k as if at position 0"),
    M("hybridnorm_ffn_skip_unnormed", "lnjax/models/placement.py",
      "    return z + dropout(sublayer(z))  # FFN: z = N(x); x = z + F(z)",
      "    return x + dropout(sublayer(z))  # FFN: z = N(x); x = z + F(z)",
      ("tests/test_placements.py::test_hybridnorm_norms_q_k_v_inside_attention_and_the_stream_before_the_ffn",),
      "HybridNorm's FFN skip adds the un-normalized stream (Pre-LN) instead of N(x)"),
    M("derf_shift_dropped", "lnjax/models/norms.py",
      "erf(ax + shift)", "erf(ax)",
      ("tests/test_placements.py::test_derf_replaces_every_norm_by_a_scaled_erf",),
      "Derf without its learned shift s"),
    # ---- Reliability round 3 (issue 28)
    M("export_output_unguarded", "lnjax/inference/export.py",
      'fileio.refuse_run_files("--output", output, [os.path.join(output, name) for name in',
      '(lambda *a, **k: None)("--output", output, [os.path.join(output, name) for name in',
      ("tests/test_reliability3.py::test_export_into_the_workdir_is_refused_and_changes_nothing",),
      "lnjax.inference.export writes into the run's workdir, replacing its config.json"),
    M("output_guard_ignores_run_files", "lnjax/core/fileio.py",
      '      elif first in RUN_FILES:\n', '      elif False:\n',
      ("tests/test_reliability3.py::test_the_output_guard_refuses_the_runs_files_only",
       "tests/test_run_guard.py::test_a_runs_own_folder_and_a_folder_of_runs_are_accepted"),
      "the output guard lets a command write over a run's config.json, metrics or checkpoints"),
    M("averaging_output_unguarded", "lnjax/core/averaging.py",
      '  fileio.refuse_run_files("--output", output, [output])\n', "",
      ("tests/test_reliability3.py::test_averaging_and_compare_refuse_an_output_in_a_runs_files",),
      "lnjax.core.averaging writes its run inside another run's checkpoints/"),
    M("compare_output_unguarded", "lnjax/analysis/compare.py",
      '  fileio.refuse_run_files("--output", output, [output + ".png", output + ".md"], own=workdirs)\n',
      "",
      ("tests/test_reliability3.py::test_averaging_and_compare_refuse_an_output_in_a_runs_files",),
      "lnjax.analysis.compare writes its figure inside a run's tensorboard/"),
    M("translate_output_unguarded", "lnjax/cli/translate.py",
      'fileio.refuse_run_files("--output", _OUTPUT.value, [_OUTPUT.value], own=[_WORKDIR.value])',
      "None",
      ("tests/test_reliability3.py::test_translate_and_export_commands_refuse_the_workdir_in_one_line",),
      "lnjax.cli.translate --output overwrites a run's metrics.jsonl"),
    # ---- Reliability round 4 (issue 62): the run guard on resolved paths, train included.
    M("run_guard_compares_unresolved_paths", "lnjax/core/fileio.py",
      "    return os.path.realpath(path)\n", "    return os.path.abspath(path)\n",
      ("tests/test_run_guard.py::test_no_command_writes_into_another_run",),
      "lnjax export --output=LINK writes into the run's checkpoints/ LINK points to"),
    M("train_workdir_unguarded", "lnjax/core/train.py",
      '  fileio.refuse_run_files("--workdir", workdir, [workdir], own=[workdir])\n', "",
      ("tests/test_run_guard.py::test_no_command_writes_into_another_run",),
      "lnjax train --workdir=RUN/checkpoints trains a new run inside another run's checkpoints"),
    M("workdir_lock_follows_symlinks", "lnjax/core/lock.py",
      "os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK", "os.O_RDWR | os.O_CREAT",
      ("tests/test_reliability3.py::test_the_workdir_lock_refuses_a_symlink_and_leaves_its_target_alone",),
      "the workdir lock writes its line into whatever file a link at .lnjax.lock points to"),
    M("sweep_lock_follows_symlinks", "lnjax/sweep/launcher.py",
      'lock.open_lock_file(os.path.join(workdir, ".lock"))',
      'os.open(os.path.join(workdir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)',
      ("tests/test_reliability3.py::test_the_workdir_lock_refuses_a_symlink_and_leaves_its_target_alone",),
      "the sweep launcher's run lock opens a link at ROOT/<run>/.lock"),
    M("translate_reads_latin1_as_text", "lnjax/inference/translate.py",
      'lines.append(line.removesuffix(b"\\r").decode("utf-8"))',
      'lines.append(line.removesuffix(b"\\r").decode("latin-1"))',
      ("tests/test_reliability3.py::test_translate_reads_undecodable_lines_as_empty_ones",),
      "lnjax.inference.translate takes non-UTF-8 input lines for text (mojibake) without a word"),
    M("checkpoint_spec_isdigit", "lnjax/core/averaging.py",
      'isinstance(spec, str) and re.fullmatch(r"[0-9]+", spec)', "spec.isdigit()",
      ("tests/test_reliability3.py::test_checkpoint_specs_take_ascii_digits_only",),
      "a checkpoint spec of superscript digits passes str.isdigit and crashes int()"),
    M("analyze_zero_batches", "lnjax/analysis/report.py",
      'errors.check_int("--batches", num_batches, 1)',
      'errors.check_int("--batches", num_batches, -10**9)',
      ("tests/test_reliability3.py::test_analyze_refuses_zero_batches_and_a_bad_rate",),
      "lnjax.analysis.report --batches=0 reaches the measurements (a division by zero)"),
    M("averaging_flags_absl_errors", "lnjax/cli/average.py",
      "app.run(main, flags_parser=cli.parse_flags)", "app.run(main)",
      ("tests/test_reliability3.py::test_averaging_last_zero_is_one_line",),
      "lnjax.cli.average --last=0 ends in absl's usage error, exit 1"),
    M("hf_hub_not_probed", "lnjax/data/sources.py",
      "unreachable = _hub_unreachable()", 'unreachable = ""',
      ("tests/test_reliability3.py::test_hf_name_offline_is_one_quick_line",),
      "an hf: name with no hub retries for half a minute with a warning per retry"),
    M("bucket_endpoint_not_probed", "lnjax/core/fileio.py",
      "    _require_reachable(storage_endpoint(), path)\n", "",
      ("tests/test_reliability3.py::test_a_bucket_without_network_is_a_bounded_line_naming_the_endpoint",),
      "a gs:// path with no network waits a minute and fails without naming the endpoint"),
    M("summary_running_after_refused_save", "lnjax/core/train.py",
      "_record_failure(workdir, e)\n", "\n",
      ("tests/test_reliability3.py::test_a_refused_save_leaves_the_summary_failed_not_running",),
      "summary.json still says running after a save was refused"),
    M("mesh_unused_devices_silent", "lnjax/core/sharding.py",
      "if everything and jax.process_index() == 0:", "if False:",
      ("tests/test_reliability3.py::test_a_mesh_on_fewer_devices_than_present_says_so",),
      "a mesh on fewer devices than the process has leaves the others idle without a word"),
    M("tfds_incomplete_left", "lnjax/data/builders.py",
      "paths.remove_incomplete(builder.data_dir)", "None",
      ("tests/test_reliability3.py::test_a_killed_preparations_incomplete_folder_is_removed_on_the_next",),
      "a killed preparation's TFDS incomplete.* folder stays in the cache"),
    # ---- Survivors of issue 26: each now killed by a test against an oracle outside lnjax.
    M("radam_is_adam", "lnjax/core/optim.py",
      "rule = optax.radam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)",
      "rule = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)",
      ("tests/test_optim.py::test_radam_updates_against_the_papers_formula",),
      "opt.name='radam' trains with plain Adam (no momentum-only start, no rectification factor)"),
    M("train_loss_window_mean_over_n_plus_1", "lnjax/core/hooks.py",
      "means = {k: v / n for k, v in self.window.items()}",
      "means = {k: v / (n + 1) for k, v in self.window.items()}",
      ("tests/test_train.py::test_logged_train_loss_is_the_mean_of_the_windows_step_losses",),
      "the logged train_* means divide each window's sum by one step too many"),
    M("lm_train_split_ignores_text_field", "lnjax/data/pipeline.py",
      'train_docs = source.texts("train", cfg.text_field)',
      'train_docs = source.texts("train")',
      ("tests/test_sources.py::test_lm_splits_read_the_named_text_field",),
      "a tfds:/hf: language model trains on the 'text' feature whatever data.text_field names"),
    M("translations_in_length_order", "lnjax/inference/evaluate.py",
      "    for i, row in zip(ids_n, decode.strip(tokens, eos_id)):",
      "    for i, row in zip(range(plan.starts[b], plan.starts[b] + plan.counts[b]),\n"
      "                      decode.strip(tokens, eos_id)):",
      ("tests/test_decode.py::test_batched_decoding_returns_each_hypothesis_in_the_input_order",),
      "translations come back sorted by source length, not in the input's order"),
    M("bucket_lock_live_local_holder_dead", "lnjax/core/lock.py",
      "      return True\n    return True\n  return time.time() - float",
      "      return True\n    return False\n  return time.time() - float",
      ("tests/test_reliability.py::test_1_bucket_lock_of_a_live_process_of_this_host_is_refused_however_old",),
      "a bucket lock held by a live process of this host is taken over as a dead one's"),
    M("dropout_key_constant", "lnjax/core/steps.py",
      "return jax.random.fold_in(jax.random.key(seed, impl=dropout_rng), step)",
      "return jax.random.key(seed, impl=dropout_rng)",
      ("tests/test_train.py::test_dropout_draws_new_masks_at_every_step",),
      "dropout draws the same mask at every step (resumed and uninterrupted runs alike)"),
    # ---- Ray back end (issue 33)
    M("ray_finished_run_launched_again", "lnjax/sweep/ray_backend.py",
      "      done = launcher.finished_state(run, self.workdir(run))\n      if done:\n"
      "        self._record(run, done)",
      "      done = None\n      if done:\n        self._record(run, done)",
      ("tests/test_ray.py::test_two_runs_spread_over_both_nodes_and_a_relaunch_starts_none",),
      "a relaunch on Ray submits runs that already finished"),
    M("ray_lost_node_not_retried", "lnjax/sweep/ray_driver.py",
      'max_retries=self.spec["reschedules"]', "max_retries=0",
      ("tests/test_ray.py::test_a_run_whose_node_is_lost_is_rescheduled_and_resumes",),
      "a run whose node is lost is not started again on another node"),
    M("ray_run_outlives_its_task", "lnjax/sweep/ray_driver.py",
      "(_die_with(parent, death_signal), priority", "(None, priority",
      ("tests/test_ray.py::test_the_cluster_stopping_mid_sweep_is_one_line_and_the_relaunch_resumes",),
      "a run whose Ray cluster stopped trains on unseen instead of saving and stopping"),
    M("ray_run_ignores_the_launchers_niceness", "lnjax/sweep/ray_driver.py",
      "priority.at_least(niceness))", "None)",
      ("tests/test_ray.py::test_a_run_whose_node_is_lost_is_rescheduled_and_resumes",),
      "a `nice -n 19` launcher's runs on Ray stay at Ray's worker niceness (15)"),
    M("ray_cluster_loss_silent", "lnjax/sweep/ray_backend.py",
      "          self._lost()\n", "          pass\n",
      ("tests/test_ray.py::test_the_cluster_stopping_mid_sweep_is_one_line_and_the_relaunch_resumes",),
      "the launcher ends without a word when its Ray cluster goes away"),
    # ---- Hugging Face import/export (issue 31)
    M("hf_conv1d_transposed_like_linear", "lnjax/hf/checkpoint.py",
      'out += dense(f"{ln}.self_attn.out", f"{h}.attn.c_proj", "same")',
      'out += dense(f"{ln}.self_attn.out", f"{h}.attn.c_proj", "linear")',
      ("tests/test_hf.py::test_imported_logits_equal_transformers_on_a_padded_batch[gpt2-right]",),
      "GPT-2's Conv1D attention output [in, out] transposed as if it were nn.Linear's"),
    M("hf_bert_linear_not_transposed", "lnjax/hf/checkpoint.py",
      'out += dense(f"{ln}.self_attn.{name}", f"{h}.attention.self.{name}", "linear")',
      'out += dense(f"{ln}.self_attn.{name}", f"{h}.attention.self.{name}", "same")',
      ("tests/test_hf.py::test_imported_logits_equal_transformers_on_a_padded_batch[bert-right]",),
      "BERT's nn.Linear q/k/v weights [out, in] read without the transpose"),
    M("hf_qkv_split_swapped", "lnjax/hf/checkpoint.py",
      'enumerate(("query", "key", "value"))', 'enumerate(("key", "query", "value"))',
      ("tests/test_hf.py::test_imported_logits_equal_transformers_on_a_padded_batch[gpt2-right]",),
      "GPT-2's c_attn split into W_K, W_Q, W_V instead of W_Q, W_K, W_V"),
    M("hf_wrong_ln_eps", "lnjax/hf/checkpoint.py",
      'norm_eps=f.number("layer_norm_epsilon", 1e-5, positive=True)', 'norm_eps=1e-5',
      ("tests/test_hf.py::test_imported_logits_equal_transformers_on_a_padded_batch[gpt2-right]",),
      "GPT-2's layer_norm_epsilon ignored (ε 1e-5 whatever config.json says)"),
    M("hf_erf_gelu_read_as_tanh", "lnjax/hf/checkpoint.py",
      '"gelu": "gelu_erf", "relu": "relu"}', '"gelu": "gelu", "relu": "relu"}',
      ("tests/test_hf.py::test_imported_logits_equal_transformers_on_a_padded_batch[bert-right]",),
      "BERT's exact erf-GELU imported as the tanh approximation"),
    M("hf_attention_mask_ignored", "lnjax/hf/checkpoint.py",
      "return imported.model.apply(variables, ids_BxT, mask_BxT=mask_BxT)",
      "return imported.model.apply(variables, ids_BxT)",
      ("tests/test_hf.py::test_imported_logits_equal_transformers_on_a_padded_batch[gpt2-left]",),
      "the attention mask of a padded batch ignored: real tokens attend to left padding"),
    M("hf_untied_bert_reads_the_unused_bias", "lnjax/hf/checkpoint.py",
      '("mlm_bias", "cls.predictions.decoder.bias", "same")]',
      '("mlm_bias", "cls.predictions.bias", "same")]',
      ("tests/test_hf.py::test_exported_folder_gives_the_same_logits_in_transformers[bert]",),
      "an untied BertForMaskedLM's output bias taken from cls.predictions.bias, which it ignores"),
    M("hf_export_embedding_unscaled", "lnjax/hf/checkpoint.py",
      "      value = value * cfg.d_model**0.5\n", "      value = value\n",
      ("tests/test_hf.py::test_exported_folder_gives_the_same_logits_in_transformers[lm_default]",),
      "an lnjax LM's √D-scaled embedding written to GPT-2 unscaled"),
    M("hf_unknown_tensor_ignored", "lnjax/hf/checkpoint.py",
      "if hf_name not in used and not _ignorable(hf_name, cfg):",
      "if hf_name not in used and False:",
      ("tests/test_hf.py::test_a_folder_lnjax_cannot_import_is_refused_in_one_line[unknown_tensor]",),
      "a tensor lnjax has no place for silently dropped on import"),
    # ---- Llama, Qwen3, Gemma 2/3, OLMo 2 (issue 59)
    M("hf_gemma_query_pre_attn_scalar_ignored", "lnjax/hf/decoders.py",
      'query_scale=f.number("query_pre_attn_scalar", 256, positive=True) ** -0.5',
      "query_scale=0.0",
      ("tests/test_hf_modern.py::test_imported_logits_equal_transformers[gemma2]",),
      "Gemma 2's attention scale query_pre_attn_scalar^-1/2 read as head_dim^-1/2"),
    M("hf_sliding_windows_dropped_on_import", "lnjax/hf/decoders.py",
      'return ",".join(kinds[:period]), window if "local" in kinds else 0',
      'return "global", 0',
      ("tests/test_hf_modern.py::test_imported_logits_equal_transformers[qwen3]",),
      "Qwen3's and Gemma's sliding-window layers imported as global attention"),
    M("hf_export_embedding_scale_dropped", "lnjax/hf/decoders.py",
      'flat["embed.embedding"] * np.float32(ours / theirs)', 'flat["embed.embedding"]',
      ("tests/test_hf_modern.py::test_an_lnjax_model_exports_as_its_family_with_its_own_logits[LlamaForCausalLM]",),
      "an lnjax LM's √D-scaled embedding written to Llama unscaled"),
    M("hf_text_read_as_latin1", "lnjax/hf/analyze.py",
      'text = raw.decode("utf-8")', 'text = raw.decode("latin-1")',
      ("tests/test_hf.py::test_text_that_cannot_be_scored_is_refused_in_one_line",),
      "a text file that is not UTF-8 analyzed as Latin-1"),
    M("hf_mlm_positions_off_by_one", "lnjax/hf/analyze.py",
      '"mlm_positions": (chosen_P + 1).astype(np.int32)',
      '"mlm_positions": chosen_P.astype(np.int32)',
      ("tests/test_hf.py::test_analyze_on_an_imported_bert_scores_its_masked_tokens",),
      "BERT's analysis scores the token before each [MASK] (the [CLS] shift forgotten)"),
    M("layer_removal_profile_reversed", "lnjax/analysis/removal.py",
      "for i in range(cfg.num_layers)]}", "for i in reversed(range(cfg.num_layers))]}",
      ("tests/test_hf.py::test_layer_removal_equals_the_model_with_that_block_passing_its_input_on[pre]",),
      "the layer-removal profile reports layer L-1-i's loss increase as layer i's"),
    M("layerwise_tied_embedding_without_its_input_rows", "lnjax/analysis/layerwise.py",
      'grads = {"embed": {"embedding": head + inputs}}', 'grads = {"embed": {"embedding": head}}',
      ("tests/test_hf_layerwise.py::test_layer_by_layer_statistics_equal_the_whole_models[llama_tied]",),
      "the tied embedding's gradient, taken layer by layer, leaves out the input tokens' rows"),
    M("layerwise_gradient_of_the_last_batch_only", "lnjax/analysis/layerwise.py",
      "grads = g_p if grads is None else jax.tree.map(jnp.add, grads, g_p)", "grads = g_p",
      ("tests/test_hf_layerwise.py::test_layer_by_layer_statistics_equal_the_whole_models[llama_tied]",),
      "a layer's gradient, taken layer by layer, is the last batch's instead of the sum"),
    M("layerwise_log_partition_of_the_largest_chunk", "lnjax/analysis/layerwise.py",
      "jnp.logaddexp(lse_BxT, lse_c)", "jnp.maximum(lse_BxT, lse_c)",
      ("tests/test_hf_layerwise.py::test_layer_by_layer_statistics_equal_the_whole_models[llama_tied]",),
      "the loss's log-partition over the vocabulary chunks keeps the largest chunk's alone"),
    M("layerwise_removal_skips_two_layers", "lnjax/analysis/layerwise.py",
      "for j in range(i + 1, cfg.num_layers):", "for j in range(i + 2, cfg.num_layers):",
      ("tests/test_hf_layerwise.py::test_layer_by_layer_statistics_equal_the_whole_models[llama_tied]",),
      "the layer-removal loss, from the kept streams, skips layer i+1 as well"),
    # ---- Health and recovery (issue 29)
    M("health_sublayer_norms_grouped_apart", "lnjax/core/health.py",
      '      sub = _SUBLAYER.match(keys[i + 1]) if i + 1 < len(keys) - 1 else None',
      '      sub = _SUBLAYER.fullmatch(keys[i + 1]) if i + 1 < len(keys) - 1 else None',
      ("tests/test_health.py::test_statistics_against_numpy",),
      "a sub-layer's norm parameters left out of its health group"),
    M("health_max_logit_includes_masked", "lnjax/models/layers.py",
      "jnp.where(bias_BxHxTxS > NEG_INF / 2, logits_BxHxTxS, -jnp.inf)",
      "logits_BxHxTxS", ("tests/test_health.py::test_statistics_against_numpy",),
      "the largest attention logit taken over masked (future) keys too"),
    M("warning_rule_rewarns_every_step", "lnjax/core/health.py",
      "if ratio >= self.factor and name not in self._alarmed:", "if ratio >= self.factor:",
      ("tests/test_health.py::test_warning_fires_once_per_excursion_with_its_ratio",),
      "the early warning repeated at every step of one excursion"),
    M("unfinished_cell_reports_its_lowest_stable_rate", "lnjax/sweep/stability_report.py",
      "lower = max((lr for lr, ok in results.items() if ok), default=None)",
      "lower = min((lr for lr, ok in results.items() if ok), default=None)",
      ("tests/test_stability.py::test_an_unfinished_search_reports_its_bounds_so_far_and_its_next_probe",),
      "a running search's table understating how high a cell is known to be stable"),
    M("early_warning_transient_is_a_blow_up", "benchmarks/early_warning.py",
      "if not math.isfinite(x) or (below and x > u + 1.0):",
      "if not math.isfinite(x) or x > min(loss[:steps.index(s) + 1]) + 1.0:",
      ("tests/test_early_warning_bench.py::test_outcome_and_scores_by_hand",),
      "a first-step transient taken for the divergence of a run that collapsed"),
    M("warning_ignores_learning_rate", "lnjax/core/health.py",
      "return value / lr if lr > 0 else None", "return value",
      ("tests/test_health.py::test_warning_needs_history_and_ignores_the_learning_rate_schedule",),
      "warm-up's growing update RMS taken for a spike"),
    M("vanishing_gradient_rewarns_every_step", "lnjax/core/health.py",
      "elif below >= self.patience and stack not in self._alarmed:",
      "elif below >= self.patience:",
      ("tests/test_health.py::test_vanishing_gradient_warns_after_patience_once_per_excursion",),
      "the vanishing-gradient warning repeated at every step of one excursion"),
    M("vanishing_gradient_compares_the_top_layer", "lnjax/core/health.py",
      "out[stack] = (layers[0] / top if top > 0 else 1.0, layers)",
      "out[stack] = (layers[max(layers)] / top if top > 0 else 1.0, layers)",
      ("tests/test_health.py::test_vanishing_gradient_warns_after_patience_once_per_excursion",),
      "the last layer's gradient judged in place of the first's"),
    M("skip_spikes_advances_state", "lnjax/core/health.py",
      "SkipSpikesState(jax.tree.map(keep, state.inner_state, new_inner),",
      "SkipSpikesState(new_inner,",
      ("tests/test_health.py::test_skip_spikes_zeroes_the_update_and_keeps_the_state",),
      "a skipped step still advances Adam's moments"),
    # ---- Stability search (issue 30)
    M("stability_bisection_moves_the_wrong_end", "lnjax/sweep/search.py",
      "      if results[mid]:\n        lo, lo_tested = mid, True",
      "      if results[mid]:\n        hi, hi_tested = mid, True",
      ("tests/test_stability.py::test_bisection_finds_the_threshold_within_tolerance_in_the_predicted_probes",),
      "a stable probe lowers the bracket's high end instead of raising its low end"),
    M("stability_finished_probe_rerun", "lnjax/sweep/search.py",
      "      if mid not in results:", "      if mid not in results or not results[mid]:",
      ("tests/test_stability.py::test_a_killed_search_resumes_without_repeating_a_probe",),
      "a probe recorded unstable is run again"),
    M("stability_probe_recorded_at_round_end", "lnjax/sweep/launcher.py",
      "    if state in FINISHED and self.on_finished:", "    if False:",
      ("tests/test_stability.py::test_a_probe_is_recorded_as_its_last_seed_finishes",),
      "a finished run is not reported to the search until its round ends"),
    M("stability_figure_colours_repeat", "lnjax/sweep/stability_report.py",
      '  style = {p: (plotting.placement_color(p, k), "osDPXhp"[k % 7]) for k, p in enumerate(placements)}',
      '  style = {p: (f"C{k % 10}", "o") for k, p in enumerate(placements)}',
      ("tests/test_plotting.py::test_stability_figure_draws_every_placement_apart_and_wraps_a_long_caption",),
      "the 11th placement of a stability figure is drawn like the first"),
    M("caption_overflows_the_figure", "lnjax/analysis/plotting.py",
      '  lines = [wrapped for line in text.split("\\n") for wrapped in textwrap.wrap(line, width)]',
      '  lines = text.split("\\n")',
      ("tests/test_plotting.py::test_stability_figure_draws_every_placement_apart_and_wraps_a_long_caption",),
      "a figure's setup line runs past the figure's edges, clipped in the PNG"),
    M("ladder_resolution_ignored", "lnjax/data/batching.py",
      "  step = (1 << (int(n).bit_length() - 1)) // per_octave  # octave start / per_octave",
      "  step = (1 << (int(n).bit_length() - 1)) // 4",
      ("tests/test_translation_data.py::test_the_octave_ladder_and_its_refusals",),
      "data.buckets_per_octave is ignored: every run compiles the quarter-octave ladder"),
    M("grid_ledger_keeps_unfinished_runs", "benchmarks/stability_search.py",
      "    if launcher.finished_state(run, os.path.join(grid_root, run.name)):",
      "    if launcher.read_json(os.path.join(grid_root, run.name, 'summary.json')):",
      ("tests/test_stability_search_bench.py::test_the_ledger_carries_finished_runs_to_a_new_workdir",),
      "a preempted grid run enters the ledger and is never run to its end"),
    M("probe_seeds_all_at_once", "lnjax/sweep/stability.py",
      "      runs = runs[:1]\n    kept", "      pass\n    kept",
      ("tests/test_stability.py::test_a_probe_runs_seed_0_alone_and_its_other_seeds_once_it_holds",),
      "a probe's seeds all launched at once: one that seed 0 alone fails costs every seed"),
    M("range_test_recovers_with_the_probes", "lnjax/sweep/stability.py",
      '        "train.on_instability": "none",', "",
      ("tests/test_stability.py::test_range_tests_never_recover_and_probes_that_roll_back_keep_checkpoints",),
      "a range test skips or rolls back its blow-up when the probes recover: its bracket's "
      "high end is lost"),
    M("failure_above_the_baseline_read_as_below", "lnjax/sweep/search.py",
      "{'-' if m[2] == 'below' else '+'}", "{'-' if m[2] == 'above' else '+'}",
      ("tests/test_stability.py::test_the_definition_of_stable",),
      "a probe that stalled above the unigram baseline is reported as having learned a little"),
    M("stall_stored_as_having_learnt", "lnjax/sweep/search.py",
      'f"held-out {-below:+.3f} nats vs unigram"', 'f"held-out {below:+.3f} nats vs unigram"',
      ("tests/test_stability.py::test_the_definition_of_stable",),
      "a probe that stalled above the unigram baseline is stored as having learnt a little"),
    M("probe_failure_not_stored", "lnjax/sweep/stability.py",
      '            "fails_by": search.fails_by(judged),', "",
      ("tests/test_stability.py::test_a_probe_runs_seed_0_alone_and_its_other_seeds_once_it_holds",),
      "an unstable probe's failure is not stored: the report reads it back from the text"),
    M("work_left_counts_one_run_a_probe", "lnjax/sweep/stability_report.py",
      "span(probes, probes * s.seeds)", "span(probes, probes)",
      ("tests/test_stability.py::test_an_unfinished_search_reports_its_bounds_so_far_and_its_next_probe",),
      "the work left counts one run a probe, though a probe that holds runs every seed"),
    M("atlas_hides_cells_still_searching", "lnjax/sweep/stability_report.py",
      "        if low is None and high is None:\n          continue  # Still searching, nothing measured yet.",
      "        if unfinished:\n          continue",
      ("tests/test_plotting.py::test_stability_figure_draws_a_searching_cell_faded_at_its_bounds_so_far",),
      "the atlas's figure leaves out what the cells still searching have bounded so far"),
    M("atlas_lift_inverted", "experiments/atlas.py",
      "return f\"{after['highest_stable_lr'] / before['highest_stable_lr']:.2g}×\"",
      "return f\"{before['highest_stable_lr'] / after['highest_stable_lr']:.2g}×\"",
      ("tests/test_atlas.py::test_the_atlas_tables_the_warmups_lift_where_both_cells_are_measured",),
      "the atlas's lift table divides the edge without warm-up by the edge after it"),
    M("stability_forgets_the_seeds_of_an_undecided_probe", "lnjax/sweep/stability.py",
      "          kept[run.name] = {k: summary[k] for k in SUMMARY_KEYS if k in summary}",
      "          pass",
      ("tests/test_stability.py::test_a_new_workdir_keeps_the_finished_seeds_of_a_probe_still_undecided",),
      "a new WORKDIR runs again the seeds an undecided probe had already finished"),
    M("search_benchmark_compares_an_unfinished_grid", "benchmarks/stability_search.py",
      "    grid_done = all(j is not None for js in judged.values() for j in js)",
      "    grid_done = any(j is not None for js in judged.values() for j in js)",
      ("tests/test_stability_search_bench.py::test_the_report_compares_the_cells_both_have_finished",),
      "a cell whose grid is still running is compared, its answer taken from part of the grid"),
    M("range_tests_borrowed_whatever_their_settings", "lnjax/sweep/stability.py",
      "      if changed:\n        raise errors.ConfigError(f\"--range_tests_from",
      "      if changed and False:\n        raise errors.ConfigError(f\"--range_tests_from",
      ("tests/test_stability.py::test_a_search_of_new_warmups_takes_the_range_tests_run_alike",),
      "a bracket measured with other range-test settings is taken as this search's"),
    M("stability_low_end_widened_below_lr_min", "lnjax/sweep/search.py",
      "      elif (widened := rounded(max(lo / widen, floor))) >= lo:",
      "      elif (widened := rounded(lo / widen)) >= lo:",
      ("tests/test_stability.py::test_a_low_end_that_fails_is_widened_down_to_lr_min_then_the_cell_stops",),
      "a low end that fails is widened past the range test's first rate"),
    M("stability_low_end_widened_once", "lnjax/sweep/search.py",
      "        lo, hi, hi_tested = widened, lo, True",
      "        lo, hi, hi_tested, floor = widened, lo, True, widened",
      ("tests/test_stability.py::test_a_low_end_that_fails_is_widened_down_to_lr_min_then_the_cell_stops",),
      "a low end that fails is widened once, then the cell stops"),
    M("stability_margin_ignored", "lnjax/sweep/search.py",
      "    if below < self.margin_nats:", "    if below < -self.margin_nats:",
      ("tests/test_stability.py::test_the_definition_of_stable",),
      "a run ending less than margin_nats below the unigram baseline counted stable"),
    M("stability_warmup_eats_the_probe", "lnjax/sweep/stability.py",
      "    steps = warmup + self.stable.steps", "    steps = self.stable.steps",
      ("tests/test_stability.py::test_every_cell_probes_as_long_at_its_peak_rate",),
      "a warm-up cell's probe spends its warm-up out of the steps at the probed rate"),
    # ---- Library (issue 32)
    M("api_load_ignores_the_checkpoint", "lnjax/api.py",
      'averaging.restore(workdir, str(checkpoint), mesh, flag="checkpoint", tasks=tasks.get)',
      'averaging.restore(workdir, "latest", mesh, flag="checkpoint", tasks=tasks.get)',
      ("tests/test_api.py::test_load_gives_the_checkpoints_parameters_and_the_tokenizer",),
      "lnjax.load gives the latest checkpoint whatever checkpoint= names"),
    M("core_imports_a_command", "lnjax/core/averaging.py",
      "from lnjax.core import checkpoint as ckpt_lib, errors, fileio, run as run_lib, sharding",
      "from lnjax.core import checkpoint as ckpt_lib, errors, fileio, run as run_lib, sharding\n"
      "from lnjax.cli import average  # noqa: F401",
      ("tests/test_architecture.py::test_the_core_imports_only_the_core_and_the_models",
       "tests/test_architecture.py::test_commands_live_in_cli_and_no_module_imports_one"),
      "the core imports a command (its flags defined on import, a layer upside down)"),
    M("core_names_the_task_registry", "lnjax/core/run.py",
      '  task = tasks(config.get("task", "lm"))',
      '  from lnjax import tasks as registry\n  task = registry.get(config.get("task", "lm"))',
      ("tests/test_architecture.py::test_the_core_imports_only_the_core_and_the_models",),
      "the core looks a run's task up in the registry itself instead of the lookup handed in"),
    M("api_train_not_exported", "lnjax/__init__.py",
      'if name in __all__:', 'if name in ("get_config", "load"):',
      ("tests/test_api.py::test_the_api_is_functions_of_lnjax_api",),
      "lnjax.train(config, workdir) fails: the package exports only part of its API"),
    M("config_name_not_resolved", "lnjax/configs/__init__.py",
      'return os.path.join(FOLDER, name + ".py") + sep + presets', "return arg",
      ("tests/test_api.py::test_config_names_resolve_to_the_package_and_paths_stay",
       "tests/test_api.py::test_console_dispatches_and_names_configs_from_another_directory"),
      "--config=lm:norm=post is looked for as a file in the current directory"),
    M("console_drops_the_flags", "lnjax/cli/console.py",
      "sys.argv = [sys.argv[0], *map(configs.resolve_flag, argv[1:])]",
      "sys.argv = [sys.argv[0]]",
      ("tests/test_api.py::test_console_dispatches_and_names_configs_from_another_directory",),
      "the lnjax command runs the tool without the flags given to it"),
    M("grid_values_as_text", "lnjax/sweep/grid.py",
      "    if isinstance(current, float):\n      return float(text)",
      "    if isinstance(current, float):\n      return text",
      ("tests/test_sweep_grid.py::test_grid_is_the_product_with_values_of_the_configs_types",),
      "--grid passes 1e-3 to a float key as the text '1e-3'"),
    M("grid_first_axis_only", "lnjax/sweep/grid.py",
      "return sweep_lib.product(*axes)", "return sweep_lib.product(*axes[:1])",
      ("tests/test_sweep_grid.py::test_grid_is_the_product_with_values_of_the_configs_types",),
      "--grid sweeps its first key only"),
    M("sweep_flag_still_required", "lnjax/cli/sweep.py",
      'flags.mark_flags_as_required(["config", "workdir"])',
      'flags.mark_flags_as_required(["config", "sweep", "workdir"])',
      ("tests/test_sweep_grid.py::test_grid_on_the_command_line_without_sweep",),
      "lnjax.sweep --grid still asks for --sweep"),
    M("averaged_workdir_has_no_best", "lnjax/core/averaging.py",
      'if kind == "best" and fileio.exists(os.path.join(workdir, AVERAGE_FILE)):',
      'if kind == "best" and fileio.exists(os.path.join(workdir, AVERAGE_FILE, "x")):',
      ("tests/test_averaged_workdir.py::test_tools_default_checkpoint_on_an_averaged_workdir",),
      "translate and --mode=predict on lnjax.core.averaging's output need --checkpoint=latest"),
    M("console_grad_norm_of_the_last_step", "lnjax/core/hooks.py",
      '                                  means["grad_norm"]))',
      '                                  metrics["grad_norm"]))',
      ("tests/test_console_output.py::test_progress_line_shows_the_logged_window_means",),
      "the console's grad_norm is the last step's while metrics.jsonl logs the window mean"),
    M("summary_lists_every_folder", "lnjax/main.py",
      "written = [name for name in RESULTS if fileio.exists(os.path.join(s[\"workdir\"], name))]",
      "written = list(RESULTS)",
      ("tests/test_console_output.py::test_the_summary_lists_only_what_the_run_wrote",),
      "the summary lists tensorboard/ (and the rest) whether or not the run wrote them"),
    M("compare_tasks_in_one_row", "lnjax/analysis/compare.py",
      "tasks = list(dict.fromkeys(_task(r) for r in runs))", 'tasks = ["lm"]; _task = lambda r: "lm"',
      ("tests/test_plotting.py::test_compare_puts_tasks_in_separate_rows_with_baseline_and_seed_band",),
      "lnjax.analysis.compare draws language-model and translation losses on one axis"),
    M("compare_without_unigram_baseline", "lnjax/analysis/compare.py",
      "baselines = sorted({round(b, 4) for b in map(_baseline, members) if b is not None})",
      "baselines = []",
      ("tests/test_plotting.py::test_compare_puts_tasks_in_separate_rows_with_baseline_and_seed_band",),
      "lnjax.analysis.compare draws no unigram baseline"),
    M("seeds_not_banded", "lnjax/analysis/plotting.py",
      "  if len(curves) == 1:\n", "  if True:\n",
      ("tests/test_plotting.py::test_mean_band_averages_seeds_and_shades_their_range",),
      "several seeds drawn as the first seed's curve, with no spread"),
    M("layer_ticks_fractional", "lnjax/analysis/plotting.py",
      "  if abs(hi - lo) < 2:\n", "  if False:\n",
      ("tests/test_plotting.py::test_integer_ticks_on_a_one_layer_axis",),
      "a one-layer axis ticked at 0.96-1.04"),
    M("wmt14_manual_keeps_empty_pairs", "lnjax/data/prepare.py",
      "            if line_de and line_en:\n", "            if True:\n",
      ("tests/test_sources.py::test_wmt14_prepare_from_manual_dir_writes_the_train_split_wmt14_de_en_reads",),
      "prepare wmt14_en_de --manual_dir keeps pairs with an empty side"),
    M("tfds_prepare_without_tensorflow_unnamed", "lnjax/data/sources.py",
      '      if importlib.util.find_spec("tensorflow") is None:\n', "      if False:\n",
      ("tests/test_sources.py::test_unprepared_tfds_name_offline_is_one_line_and_leaves_no_workdir",),
      "an unprepared tfds: name without TensorFlow does not say that TensorFlow is needed"),
    M("footprint_never_rebases", "lnjax/core/allocator.py",
      "    self.baseline = rss\n    self.releases += 1\n    return True\n",
      "    self.baseline = rss_bytes()\n    self.releases += 1\n    return True\n",
      ("tests/test_allocator.py::test_footprint_releases_after_the_first_steps_then_only_when_the_process_grew",),
      "a run whose scratch regrows into released holes releases (and refaults) every step"),
    M("release_keeps_holes", "lnjax/core/allocator.py", "  trim(_TRIM_THRESHOLD)\n",
      "  pass\n",
      ("tests/test_allocator.py::test_a_freed_block_below_a_live_one_stays_resident_until_released",),
      "the heap's freed holes stay resident (no malloc_trim)"),
    # ---- TPU plans (issue 60)
    M("activations_left_unconstrained", "lnjax/core/sharding.py",
      "  if mesh is None or mesh.size == 1:\n    return x\n  spec = nn.logical_to_mesh_axes",
      "  if True:\n    return x\n  spec = nn.logical_to_mesh_axes",
      ("tests/test_compile_plan.py::test_fsdp_keeps_the_activations_split_over_the_batch",),
      "the models' activations carry no sharding constraints (XLA replicates them under fsdp)"),
    M("health_statistics_slice_the_stack_first", "lnjax/core/health.py",
      "  sq, counts = _per_layer(jax.tree.map(lead_sums, tree), cfg), _per_layer(\n"
      "      jax.tree.map(lead_counts, tree), cfg)",
      "  sliced = _per_layer(tree, cfg)\n"
      "  sq = jax.tree.map(lambda x: jnp.square(jnp.asarray(x).astype(jnp.float32)), sliced)\n"
      "  counts = jax.tree.map(lambda x: np.ones(np.shape(x), int), sliced)",
      ("tests/test_compile_plan.py::test_the_health_statistics_keep_no_copy_of_the_updates",),
      "the per-layer health statistics slice a scanned stack's updates before reducing them "
      "(a float32 copy of the updates on TPU)"),
    M("dropout_rng_ignored", "lnjax/core/steps.py",
      "jax.random.key(seed, impl=dropout_rng)", "jax.random.key(seed)",
      ("tests/test_train.py::test_dropout_masks_come_from_the_configured_generator",),
      "train.dropout_rng is ignored: dropout's masks always come from threefry"),
    M("single_process_saves_slice_every_array", "lnjax/core/checkpoint.py",
      "  if jax.process_count() == 1:\n    ocp.type_handlers", "  if False:\n    ocp.type_handlers",
      ("tests/test_sharding.py::test_a_single_process_save_compiles_no_program",),
      "a single-process save slices each replicated array on device (one program per shape)"),
    # ---- Survivors of an independent mutation run (issue 62), each pinned by an oracle.
    M("average_of_the_first_n_checkpoints", "lnjax/core/averaging.py",
      "steps = steps[-number:]", "steps = steps[:number]",
      ("tests/test_reliability.py::test_3_avg_2_is_the_numpy_mean_of_the_last_2_of_3_checkpoints",),
      "avg:N averages the first N checkpoints kept, not the last N"),
    M("rollback_lr_scale_compounded", "lnjax/core/loop.py",
      "      self.lr_scale = action.lr_scale", "      self.lr_scale *= action.lr_scale",
      ("tests/test_hooks.py::test_two_rollbacks_at_factor_one_half_scale_the_rate_by_one_half_then_one_quarter",),
      "a rollback's learning-rate scale multiplies the restored one instead of replacing it"),
    M("rollback_lr_factor_to_the_r", "lnjax/core/health_hooks.py",
      "scale = self.lr_factor ** (rollbacks + 1)", "scale = self.lr_factor ** rollbacks",
      ("tests/test_hooks.py::test_two_rollbacks_at_factor_one_half_scale_the_rate_by_one_half_then_one_quarter",),
      "the r-th rollback scales the rate by factor^r (the first not at all)"),
    M("max_rollbacks_off_by_one", "lnjax/core/health_hooks.py",
      "if rollbacks >= self.max_rollbacks:", "if rollbacks > self.max_rollbacks:",
      ("tests/test_hooks.py::test_max_rollbacks_1_allows_exactly_one",),
      "train.max_rollbacks=R allows R + 1 rollbacks"),
    M("warning_needs_one_step_more", "lnjax/core/health.py",
      "if len(history) >= self.min_history:", "if len(history) > self.min_history:",
      ("tests/test_health.py::test_the_warning_judges_from_exactly_min_history_steps",),
      "the early warning judges only after min_history + 1 steps"),
    M("skip_rule_grad_norm_against_the_loss", "lnjax/core/health.py",
      "spikes(grad_norm, state.grad_norms)", "spikes(grad_norm, state.losses)",
      ("tests/test_health.py::test_skip_spikes_skips_a_gradient_norm_spike_under_a_steady_loss",),
      "train.on_instability=skip judges the gradient norm against the loss history"),
    M("health_log_built_as_off", "lnjax/core/train.py",
      'if run.train.health != "off" else None)', 'if run.train.health == "warn" else None)',
      ("tests/test_health.py::test_a_run_with_health_log_records_the_statistics",),
      "train.health=log records nothing (built as off)"),
    M("activation_statistics_at_every_step", "lnjax/core/health_hooks.py",
      "if self._log_next else {}", "if True else {}",
      ("tests/test_hooks.py::test_health_log_records_the_statistics_and_warn_also_warns",),
      "the activation statistics' forward pass runs at every step, not at log steps only"),
    M("activation_statistics_with_other_masks", "lnjax/core/steps.py",
      "seed, dropout_rng, step)}, mutable", "seed, dropout_rng, step + 1)}, mutable",
      ("tests/test_health.py::test_the_forward_pass_sees_the_train_steps_dropout_masks",),
      "the activation statistics' forward pass draws another step's dropout masks"),
    M("clipping_after_the_optimizer", "lnjax/core/optim.py",
      "optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), rule)",
      "optax.chain(rule, optax.clip_by_global_norm(cfg.grad_clip_norm))",
      ("tests/test_optim.py::test_clipped_adamw_is_optax_clip_then_adamw_with_the_configured_weight_decay",),
      "opt.grad_clip_norm clips the optimizer's update instead of the gradient"),
    M("adamw_weight_decay_dropped", "lnjax/core/optim.py",
      "eps=cfg.eps, weight_decay=cfg.weight_decay)", "eps=cfg.eps)",
      ("tests/test_optim.py::test_clipped_adamw_is_optax_clip_then_adamw_with_the_configured_weight_decay",),
      "AdamW ignores opt.weight_decay (optax's default 1e-4 used)"),
    M("sgd_nesterov_dropped", "lnjax/core/optim.py",
      "momentum=cfg.momentum or None, nesterov=cfg.nesterov)", "momentum=cfg.momentum or None)",
      ("tests/test_optim.py::test_sgd_with_nesterov_momentum_against_its_closed_form",),
      "opt.nesterov=True trains with plain momentum"),
    M("bucket_lock_stale_after_90_s", "lnjax/core/lock.py",
      "STALE_SECONDS = 900", "STALE_SECONDS = 90",
      ("tests/test_reliability3.py::test_a_bucket_lock_of_another_host_is_taken_over_after_15_minutes",),
      "a bucket lock refreshed 2 minutes ago is taken over from its live run"),
    M("widened_low_end_keeps_the_upper_end", "lnjax/sweep/search.py",
      "lo, hi, hi_tested = widened, lo, True", "lo, hi, hi_tested = widened, hi, True",
      ("tests/test_stability.py::test_a_widened_low_end_becomes_the_upper_end",),
      "a widened low end leaves the upper end above the rate just found unstable"),
    M("adam_preconditioner_bias_corrected_a_step_late", "lnjax/analysis/sharpness.py",
      "jnp.sqrt(nu / (1 - b2 ** count)) + eps", "jnp.sqrt(nu / (1 - b2 ** (count + 1))) + eps",
      ("tests/test_sharpness.py::test_adams_preconditioner_is_the_bias_corrected_root_of_its_second_moment",),
      "Adam's preconditioner in the sharpness corrected for one update too many"),
    M("lanczos_without_orthogonalization", "lnjax/analysis/sharpness.py",
      "w = w - basis.T @ (basis @ w)\n  return w - basis.T @ (basis @ w)",
      "return w",
      ("tests/test_sharpness.py::test_a_few_iterations_find_a_separated_top_eigenvalue_of_a_large_spectrum",),
      "the Lanczos vectors not orthogonalized against the basis (no three-term recurrence)"),
    M("sgd_threshold_nesterov_as_heavy_ball", "lnjax/analysis/sharpness.py",
      "return (2 + 2 * momentum) / (1 + 2 * momentum) if nesterov else 2 + 2 * momentum",
      "return 2 + 2 * momentum",
      ("tests/test_sharpness.py::test_sgds_threshold_is_where_optaxs_sgd_stops_converging_on_a_quadratic",),
      "SGD's stability threshold with Nesterov's momentum taken as heavy-ball's, 2 + 2β"),
    M("adam_preconditioner_without_the_first_moments_correction", "lnjax/analysis/sharpness.py",
      "(1 - b1 ** count) * (jnp.sqrt", "(jnp.sqrt",
      ("tests/test_sharpness.py::test_adams_update_is_its_first_moment_over_the_preconditioner",),
      "Adam's preconditioner without 1 − β₁ᵗ, which divides its update as P does"),
    M("sharpness_counts_training_steps_not_updates", "lnjax/analysis/sharpness.py",
      "return int(counted.count) if counted is not None else step", "return step",
      ("tests/test_sharpness.py::test_the_update_count_is_the_optimizers_not_the_training_steps",),
      "the sharpness's bias corrections and rate taken at the training step, skipped steps "
      "counted"),
    M("restore_without_the_skip_wrapper", "lnjax/core/checkpoint.py",
      "setup = build.run_setup(run, None)",
      "setup = state_lib.make_setup(run.model, run.opt, run.train.num_steps, task=run.task)",
      ("tests/test_analysis.py::test_analyze_restores_a_run_that_skips_spikes",),
      "a run that skips spikes restored with a plain optimizer's state: analysis fails"),
    M("prediction_goes_on_after_a_stopped_feature_run", "lnjax/sweep/predict.py",
      'if summary["status"] == "preempted":', "if False:",
      ("tests/test_predict.py::test_sigterm_stops_a_prediction_in_one_line_and_the_same_command_finishes_it",),
      "`stability --predict` stopped by SIGTERM predicts from the cut-short run, exit 0"),
    M("prediction_checks_only_the_block_keys", "lnjax/sweep/predict.py",
      'if key not in ("task",) + BLOCK_KEYS + SIZE_KEYS and key in mine and mine[key] != value:',
      "if False:",
      ("tests/test_predict.py::test_a_block_or_depth_the_fit_has_not_seen_is_refused",),
      "a prediction for another β₁, ε, dtype or schedule than the fit's, without a word"),
    M("adam_sharpness_counts_coordinates_never_moved", "lnjax/analysis/sharpness.py",
      "nu > 0, (1 - b1 ** count)", "nu >= 0, (1 - b1 ** count)",
      ("tests/test_sharpness.py::test_coordinates_without_a_gradient_are_left_out_of_adams_sharpness",),
      "a parameter without a gradient yet (v̂ = 0) in P⁻¹H at 1/ε: λ_max swamped"),
    M("hf_tied_head_never_compared", "lnjax/hf/checkpoint.py",
      "  _check_tied_copy(tensors, cfg, mapping)\n", "",
      ("tests/test_hf_modern.py::test_a_tied_models_saved_head_is_read_only_where_it_copies_the_embedding",),
      "a tied model's stored head that differs from its embedding silently replaced by it"),
    M("gemma3_local_theta_ignored", "lnjax/hf/decoders.py",
      '"sliding_attention": f.number("rope_local_base_freq", 10000.0, positive=True)}',
      '"sliding_attention": default}',
      ("tests/test_hf_modern.py::test_gemma3_with_two_rope_thetas_is_refused_naming_rope_parameters",),
      "Gemma 3's transformers-4 config read with its global θ for the local layers too"),
    # ---- Survivors of a mutation run on the modern block (rotary, gated FFN, GQA, soft-caps,
    # windows, RMSNorm, HybridNorm, Derf, the Hugging Face mapping), each pinned by an oracle.
    M("derf_unit_offset_dropped", "lnjax/models/placement.py",
      "return norms.Derf(cfg.derf_alpha_init, cfg.dtype, cfg.norm_unit_offset, name=name)",
      "return norms.Derf(cfg.derf_alpha_init, cfg.dtype, name=name)",
      ("tests/test_placements.py::test_dyt_and_derf_take_the_unit_offset_gain[derf]",),
      "Derf under model.norm_unit_offset stores its gain γ itself (init 1), not w of 1 + w"),
    M("dyt_unit_offset_dropped", "lnjax/models/placement.py",
      "return norms.DyT(alpha or cfg.dyt_alpha_init, cfg.dtype, cfg.norm_unit_offset, name=name)",
      "return norms.DyT(alpha or cfg.dyt_alpha_init, cfg.dtype, name=name)",
      ("tests/test_placements.py::test_dyt_and_derf_take_the_unit_offset_gain[dyt]",),
      "DyT under model.norm_unit_offset stores its gain γ itself (init 1), not w of 1 + w"),
    M("hf_qwen3_window_layers_off_by_one", "lnjax/hf/decoders.py",
      '["sliding_attention" if i >= first else', '["sliding_attention" if i > first else',
      ("tests/test_hf_modern.py::test_layer_types_left_out_are_filled_in_as_transformers_does",),
      "a Qwen3 config.json without layer_types: layer max_window_layers read as global"),
    M("hf_olmo2_rms_norm_eps_default", "lnjax/hf/decoders.py",
      '"Olmo2ForCausalLM": Family("olmo2", "olmo2", _OLMO2_NORMS + _QK_NORM, rms_norm_eps=1e-5)',
      '"Olmo2ForCausalLM": Family("olmo2", "olmo2", _OLMO2_NORMS + _QK_NORM)',
      ("tests/test_hf_modern.py::test_a_config_without_rms_norm_eps_reads_its_familys_default",),
      "an OLMo 2 config.json without rms_norm_eps read with ε = 1e-6, not Olmo2Config's 1e-5"),
    M("health_counts_as_host_arrays", "lnjax/core/health.py",
      "return np.broadcast_to(np.prod(shape[1:], dtype=np.int64), shape[:1])",
      "return np.full(shape[:1], np.prod(shape[1:], dtype=int))",
      ("tests/test_health.py::test_a_group_past_two_billion_entries_traces_without_a_host_array_of_its_size",),
      "the health statistics' counts as host arrays as long as each parameter's leading axis"),
    M("health_count_as_an_int32_argument", "lnjax/core/health.py",
      "jnp.sqrt(s / float(max(n, 1)))", "jnp.sqrt(s / max(n, 1))",
      ("tests/test_health.py::test_a_group_past_two_billion_entries_traces_without_a_host_array_of_its_size",),
      "a group's entry count past 2³¹ passed to the step as an int32: an overflow"),
]


def copy_repo(dest: str) -> str:
  """lnjax/, tests/ (with its fixture corpora), configs/, benchmarks/, experiments/,
  pyproject.toml under dest/repo."""
  root = os.path.join(dest, "repo")
  os.makedirs(root)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
  for name in COPIED:
    src = os.path.join(REPO, name)
    if os.path.islink(src):  # configs/ -> lnjax/configs: the copy's own package folder.
      os.symlink(os.readlink(src), os.path.join(root, name))
    elif os.path.isdir(src):
      shutil.copytree(src, os.path.join(root, name), ignore=ignore)
    else:
      shutil.copy2(src, os.path.join(root, name))
  return root


class PatternError(Exception):
  """The mutant's pattern is not in its file exactly once (the code moved: update it)."""


def apply(mutant: Mutant, root: str) -> None:
  path = os.path.join(root, mutant.path)
  with open(path) as f:
    text = f.read()
  count = text.count(mutant.find)
  if count != 1:
    raise PatternError(f"the pattern occurs {count} times in {mutant.path} (expected once): "
                       f"{mutant.find[:80]!r}")
  with open(path, "w") as f:
    f.write(text.replace(mutant.find, mutant.replace))


def run_tests(root: str, tests, timeout: float) -> tuple[int, str]:
  env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
         "PYTHONDONTWRITEBYTECODE": "1"}
  cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
  try:
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                       timeout=timeout)
  except subprocess.TimeoutExpired as e:
    return -1, f"timed out after {timeout:.0f} s\n{e.stdout or ''}"
  return r.returncode, r.stdout + r.stderr


def check_copy_is_imported(root: str) -> None:
  """The copy's lnjax is the one Python imports there (not the installed, editable one)."""
  env = {**os.environ, "PYTHONPATH": root}
  out = subprocess.run([sys.executable, "-c", "import lnjax; print(lnjax.__file__)"], cwd=root,
                       env=env, capture_output=True, text=True, check=True).stdout.strip()
  if not out.startswith(root):
    raise SystemExit(f"the copy imports lnjax from {out}, not from {root}")


def failed_test(output: str) -> str:
  """The first failing (or erroring) test id in pytest's summary."""
  m = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
  test = m.group(1) if m else "(no test id: " + (output.strip().splitlines() or ["?"])[-1] + ")"
  error = re.search(r"^E +(\S.*)$", output, re.M)  # The first line of the failure.
  return test + (f"  [{error.group(1)[:70]}]" if error else "")


def run_mutant(mutant: Mutant, timeout: float) -> tuple[bool, str, float]:
  """(killed, by which test or why it survived (or was not applied), seconds)."""
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix=f"lnjax_mutant_{mutant.name}_") as tmp:
    root = copy_repo(tmp)
    check_copy_is_imported(root)
    try:
      apply(mutant, root)
    except PatternError as e:
      return False, f"NOT APPLIED: {e}", time.perf_counter() - t0
    code, output = run_tests(root, mutant.tests, timeout)
  seconds = time.perf_counter() - t0
  if code == 0:
    return False, "all of " + ", ".join(mutant.tests) + " passed", seconds
  if code == 5 or "no tests ran" in output or "not found:" in output:
    raise SystemExit(f"mutant {mutant.name}: its tests were not found:\n{output[-2000:]}")
  return True, failed_test(output), seconds


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--only", default="", help="comma-separated mutant names")
  parser.add_argument("--list", action="store_true", help="list the mutants and exit")
  parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per mutant")
  args = parser.parse_args()
  names = [m.name for m in MUTANTS]
  assert len(set(names)) == len(names), "two mutants share a name"
  chosen = MUTANTS
  if args.only:
    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
      parser.error(f"unknown mutants {', '.join(unknown)}; --list shows them")
    chosen = [m for m in MUTANTS if m.name in wanted]
  if args.list:
    for m in chosen:
      print(f"{m.name}  ({m.path}): {m.what}\n    " + "\n    ".join(m.tests))
    return 0
  t0 = time.perf_counter()
  survived = []
  for i, m in enumerate(chosen, 1):
    killed, detail, seconds = run_mutant(m, args.timeout)
    verdict = ("killed  " if killed else "ERROR   " if detail.startswith("NOT APPLIED")
               else "SURVIVED")
    print(f"[{i:>2}/{len(chosen)}] {verdict} {m.name:<40} {seconds:6.1f} s  "
          f"{'by ' if killed else ''}{detail}", flush=True)
    if not killed:
      survived.append(m.name)
  total = time.perf_counter() - t0
  print(f"\n{len(chosen) - len(survived)} of {len(chosen)} mutants killed in {total:.0f} s"
        + (f"; survived: {', '.join(survived)}" if survived else ""))
  return 1 if survived else 0


if __name__ == "__main__":
  sys.exit(main())
