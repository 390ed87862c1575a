"""The multi-rank checks' shared contract (smoke.ranks) and the parts of train/nccl that need no torch.

Real ranks started by the real launcher (with a stand-in worker that needs no torch): tests/integration/
test_smoke_ranks_real.py.
"""

from smoke import nccl, ranks, report, train, train_trainer


def test_only_rank_0_writes(tmp_path):
    res = report.Result("x", "cpu")
    res.add("a", False, "broken")
    target = tmp_path / ".x.rank0.json"
    assert ranks.write_rank0_result(1, res, env={"SMOKE_RESULT": str(target)}) is None
    assert not target.exists()
    ranks.write_rank0_result(0, res, env={"SMOKE_RESULT": str(target)})
    assert report.read_json(str(target)) == {"items": [{"name": "a", "ok": False, "detail": "broken"}],
                                             "figures": {}}


def test_launcher_verdict_names_a_hang_and_a_missing_result():
    res = report.Result("train", "cpu")
    hung = {"timed_out": True, "rcs": [-15, -15], "first_failure": None, "logs": []}
    assert ranks.record_exit(res, hung, {}, 884.6, "adamw: ") is False
    assert res.items == [
        {"name": "adamw: ranks finished within timeout", "ok": False, "detail": "killed after 885s (hang?)"},
        {"name": "adamw: rank 0 wrote its result", "ok": False, "detail": "no result from rank 0"}]
    res = report.Result("nccl", "cpu")
    crashed = {"timed_out": False, "rcs": [0, 1], "first_failure": 1, "logs": []}
    assert ranks.record_exit(res, crashed, {"items": []}, 300) is False
    assert res.items == [{"name": "all ranks exited 0", "ok": False, "detail": "exit codes [0, 1]"}]


def test_failure_explained_from_the_logs_of_the_rank_that_failed_first(tmp_path):
    logs = [tmp_path / "train-adamw.rank0.log", tmp_path / "train-adamw.rank1.log"]
    logs[0].write_text("waiting in a collective\n")
    logs[1].write_text("building cpu_adam\nRuntimeError: Ninja is required to load C++ extensions\n")
    res = report.Result("train", "cpu")
    ranks.explain_failure(res, {"logs": [str(p) for p in logs], "first_failure": 1}, "adamw: ")
    assert res.diagnosis[0].startswith("ninja_missing:")
    assert res.diagnosis[1] == ("adamw: rank 1 failed first; log tail:\n==> train-adamw.rank1.log <==\n"
                                "building cpu_adam\nRuntimeError: Ninja is required to load C++ extensions")


def test_deepspeed_configs_are_the_ones_users_start_from():
    adamw = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
             "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
             "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
             "bf16": {"enabled": False}, "gradient_clipping": 1.0, "steps_per_print": 10 ** 9,
             "wall_clock_breakdown": False}
    assert train.ds_config(False) == train.ds_config(False, "adamw") == adamw
    offload = train.ds_config(True, "offload")
    assert offload["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert offload["bf16"] == {"enabled": True}
    del offload["zero_optimization"]["offload_optimizer"]
    assert dict(offload, bf16={"enabled": False}) == adamw  # nothing else differs


def test_train_loss_checks_catch_nan_and_a_loss_that_did_not_fall():
    res = report.Result("train", "cpu")
    train.check_loss(res, [5.5, float("nan")], 5.5, 5.6, 2, 0.5)
    assert [(i["name"], i["ok"]) for i in res.items] == [("loss finite", False), ("loss fell after 2 steps", False)]
    assert res.items[1]["detail"] == "5.5000 -> 5.6000" and res.figures["steps_per_s"] == 4.0
    res = report.Result("train", "cpu")
    train.check_loss(res, [5.5, 5.4], 5.5, 5.3, 2, 0.0)
    assert res.passed and res.figures["steps_per_s"] is None


def test_both_deepspeed_configs_run_in_one_job_and_land_under_their_names(monkeypatch, tmp_path):
    """adamw and offload share one launch (imports and the process group paid once); the worker names each item
    after its config, the parent files the figures per config and the job's wall time and logs under "deepspeed"."""
    seen = {}

    def fake_run_job(module, n, out_dir, job, timeout, env, node=None):
        seen.update(module=module, job=job, variants=env["SMOKE_VARIANTS"], ckpt=env["SMOKE_CKPT_DIR"])
        data = {"items": [{"name": f"{v}: loss finite", "ok": True, "detail": ""} for v in train.VARIANTS],
                "figures": {"dtype": "fp32",
                            "adamw": {"optimizer": "FusedAdam", "loss_first": 5.5, "loss_last": 5.25},
                            "offload": {"optimizer": "DeepSpeedCPUAdam", "loss_first": 5.5, "loss_last": 5.3}}}
        return {"seconds": 31.5, "logs": ["l0", "l1"], "rcs": [0, 0], "timed_out": False, "first_failure": None}, data

    monkeypatch.setattr(train.ranks, "run_job", fake_run_job)
    res = report.Result("train", "cpu")
    train.run_deepspeed_job(res, "cpu", 2, str(tmp_path), 5, 600)
    assert seen["module"] == "smoke.train" and seen["job"] == "train-deepspeed" and seen["variants"] == "adamw,offload"
    assert [i["name"] for i in res.items] == ["adamw: loss finite", "offload: loss finite", "deepspeed: all ranks exited 0"]
    assert res.passed and res.figures["dtype"] == "fp32" and res.figures["adamw"]["optimizer"] == "FusedAdam"
    assert res.figures["deepspeed"] == {"wall_seconds": 31.5, "logs": ["l0", "l1"], "variants": ["adamw", "offload"]}
    train.summarise(res, 2)
    assert res.summary == ("2 ranks fp32: adamw (FusedAdam) loss 5.5000 -> 5.2500; "
                           "offload (DeepSpeedCPUAdam) loss 5.5000 -> 5.3000")


def test_a_failed_deepspeed_job_says_which_rank_failed_first(monkeypatch, tmp_path):
    log = tmp_path / "train-deepspeed.rank1.log"
    log.write_text("RuntimeError: boom\n")
    monkeypatch.setattr(train.ranks, "run_job", lambda *a, **k: (
        {"seconds": 9.0, "logs": [str(tmp_path / "r0.log"), str(log)], "rcs": [0, 1], "timed_out": False,
         "first_failure": 1}, {}))
    res = report.Result("train", "cpu")
    train.run_deepspeed_job(res, "cpu", 2, str(tmp_path), 5, 600)
    assert not res.passed
    assert [i["name"] for i in res.items if not i["ok"]] == ["deepspeed: all ranks exited 0",
                                                               "deepspeed: rank 0 wrote its result"]
    assert any("deepspeed: rank 1 failed first" in d and "boom" in d for d in res.diagnosis)


def test_trainer_resume_figures_join_the_summary_and_the_deepspeed_launchers_flag_is_accepted(monkeypatch):
    res = report.Result("train", "cpu")
    data = {"items": [{"name": "resume continued at step 3 up to 4", "ok": True, "detail": ""}],
            "figures": {"dtype": "fp32", "loss_first": 5.568, "loss_last": 5.424, "resumed_at": 2,
                        "global_step": 4}}
    train.merge_variant(res, "trainer-resume", {"seconds": 40.0, "logs": []}, data)
    assert res.items[0]["name"] == "trainer-resume: resume continued at step 3 up to 4"
    train.summarise(res, 2)
    assert res.summary == "2 ranks fp32: Trainer loss 5.5680 -> 5.4240, resumed at step 2 to 4"
    monkeypatch.delenv("SMOKE_TRAINER_PHASE", raising=False)
    monkeypatch.delenv("SMOKE_STEPS", raising=False)
    args = train_trainer.parse_args(["--out", "/tmp/t", "--local_rank=1"])  # what `deepspeed` appends
    assert (args.out, args.steps, args.phase, args.local_rank) == ("/tmp/t", 4, None, 1)


def test_nccl_busbw_below_the_floor_fails_and_cpu_is_not_gated(monkeypatch):
    monkeypatch.delenv("SMOKE_MIN_BUSBW_GBPS", raising=False)
    res = report.Result("nccl", "gpu")
    res.figures.update(backend="nccl", gpu_name="NVIDIA H100 80GB HBM3", sizes=[{}] * 6,
                       largest={"bytes": 2 ** 28, "busbw_gbps": 100.0})
    nccl.check_busbw(res, 8)
    assert res.items == [{"name": "busbw >= floor at 256 MB", "ok": False,
                          "detail": "100.0 GB/s vs floor 220.0 (table (H100.*(HBM3|SXM) x8))"}]
    nccl.summarise(res, "gpu", 8)
    assert res.summary == "8 ranks nccl, 6 sizes exact, 256 MB busbw 100.00 GB/s"
    cpu = report.Result("nccl", "cpu")
    cpu.figures.update(backend="gloo", sizes=[{}] * 4, largest={"bytes": 2 ** 22, "busbw_gbps": 0.5})
    nccl.summarise(cpu, "cpu", 2)
    assert cpu.summary == "2 ranks gloo, 4 sizes exact, 4 MB busbw 0.50 GB/s (CPU: not gated)"


def _logs(tmp_path, *texts):
    paths = []
    for rank, text in enumerate(texts):
        path = tmp_path / f"job.rank{rank}.log"
        path.write_text(text)
        paths.append(str(path))
    return paths


LEFT = f"{ranks.TEARDOWN_MARK} barrier\n{ranks.TEARDOWN_MARK} destroy_process_group\n{ranks.TEARDOWN_MARK} exit\n"


def test_a_rank_that_aborts_after_its_work_and_the_final_barrier_leaves_the_exit_not_proven(tmp_path):
    """exit codes [0, -6] (the gate flake of issue 49): every rank did its work and left the group, one was ended
    by std::terminate at interpreter exit. What the gate proves is said: the work, not the clean exit."""
    data = {"items": [{"name": "loss fell", "ok": True, "detail": ""}]}
    aborted = {"timed_out": False, "rcs": [0, -6], "first_failure": 1,
               "logs": _logs(tmp_path, LEFT, LEFT + "terminate called without an active exception\n")}
    res = report.Result("train", "cpu")
    res.items.extend(data["items"])
    assert ranks.record_exit(res, aborted, data, 300, "trainer-resume: ") is True
    exit_item = res.items[-1]
    assert exit_item["name"] == "trainer-resume: all ranks exited 0" and exit_item["ok"] is None
    assert "rank 1 exited -6 at interpreter exit, after destroy_process_group()" in exit_item["detail"]
    assert any(d.startswith("exit_abort:") for d in res.diagnosis)  # read from rank 1's log by smoke.signatures
    res.finish()
    assert res.passed and res.summary.endswith(
        "teardown fault, exit not proven: trainer-resume: rank 1 exited -6 at interpreter exit, after "
        "destroy_process_group()")


def test_a_failure_before_the_final_barrier_or_without_rank_0s_result_still_fails(tmp_path):
    data = {"items": [{"name": "loss fell", "ok": True, "detail": ""}]}
    in_barrier = {"timed_out": False, "rcs": [0, 1], "first_failure": 1,
                  "logs": _logs(tmp_path, LEFT, f"{ranks.TEARDOWN_MARK} barrier\nRuntimeError: gloo timeout\n")}
    assert ranks.record_exit(report.Result("t", "cpu"), in_barrier, data, 300) is False
    during_work = dict(in_barrier, logs=_logs(tmp_path, LEFT, "Traceback: CUDA error\n"))
    assert ranks.record_exit(report.Result("t", "cpu"), during_work, data, 300) is False
    aborted = dict(in_barrier, rcs=[0, -6], logs=_logs(tmp_path, LEFT, LEFT))
    res = report.Result("t", "cpu")
    assert ranks.record_exit(res, aborted, {}, 300) is False, "no result from rank 0: the work is not proven"
    assert [i["ok"] for i in res.items] == [False, False]
