"""GPT-J passes ftx's family conformance kit."""

from ftx_gptj.family import GPTJ
from ftx_triton.testing.conformance import FamilyConformance
from tiny_configs import GPTJ_TINY


class TestGPTJ(FamilyConformance):
    family = GPTJ
    tiny_hf_config = GPTJ_TINY
