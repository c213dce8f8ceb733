"""What a child process that runs model-written code keeps of the environment (arctic_rl/child_env.py)."""

from __future__ import annotations

from arctic_rl.child_env import scrubbed_env


def test_secrets_go_and_ordinary_settings_stay():
    parent = {
        "PATH": "/usr/bin",
        "HOME": "/home/me",
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "0",
        "PYENV_ROOT": "/opt/pyenv",
        "HTTPS_PROXY": "http://proxy:3128",
        "ARCTIC_RL_TOKEN": "t",
        "ARCTIC_RL_JOB_DIR": "/jobs/1",
        "RAY_ADDRESS": "10.0.0.1:6379",
        "ray_auth_token": "t",
        "MLFLOW_TRACKING_URI": "http://mlflow:5000",
        "WANDB_API_KEY": "k",
        "GITHUB_TOKEN": "t",
        "DB_PASSWORD": "p",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "AWS_PROFILE": "prod",
        "GOOGLE_APPLICATION_CREDENTIALS": "/k.json",
        "UPSTREAM": "https://u:p@example.com/x",
    }
    assert scrubbed_env(parent) == {
        k: parent[k]
        for k in ("PATH", "HOME", "LANG", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYENV_ROOT", "HTTPS_PROXY")
    }
