"""msmon inside MindSpore Transformers (MindFormers): `MsmonCallback`, built by MindFormers from a training YAML.

    callbacks:
      - type: MFLossMonitor
      - type: MsmonCallback
        auto_register: msmon_callback.MsmonCallback   # with run_mindformer.py --register_path "$MSMON_REGISTER"
        run_id: llama2-7b
        bot: {url: http://msmon-bot:8080, token_env: MSMON_TOKEN}

Importing this package registers `MsmonCallback` as a MindFormers callback (MindFormerRegister,
MindFormerModuleType.CALLBACK), so a script that imports it needs no `auto_register` line; run_mindformer.py loads
`REGISTER_PATH/msmon_callback.py`, which imports it. docs/user-guide/mindformers.md walks a job through it.
"""

import os

from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

from .callback import MsmonCallback, training_config

# The folder to give run_mindformer.py as --register_path (it holds msmon_callback.py)
REGISTER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "register")

MindFormerRegister.register_cls(MsmonCallback, MindFormerModuleType.CALLBACK)

__all__ = ["REGISTER_PATH", "MsmonCallback", "training_config"]
