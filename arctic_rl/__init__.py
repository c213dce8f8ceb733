"""arctic-rl: the compute layer behind RL post-training frameworks.

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
"""

from arctic_rl.client import ArcticRLClient, create_arctic_rl_client
from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.errors import (
    ArcticRLError,
    BatchFormatError,
    ConfigError,
    EngineDeadError,
    EngineError,
    EngineStartError,
    UnknownNameError,
    WeightSyncError,
)
from arctic_rl.losses import register_loss_fn, register_post_processor

__all__ = [
    "ArcticRLClient",
    "ArcticRLClientConfig",
    "create_arctic_rl_client",
    "register_loss_fn",
    "register_post_processor",
    "ArcticRLError",
    "BatchFormatError",
    "ConfigError",
    "EngineDeadError",
    "EngineError",
    "EngineStartError",
    "UnknownNameError",
    "WeightSyncError",
]
