"""The committed GLM-4.7 chat template is llama.cpp's, byte for byte below its comment line.

support.glm5_chat serves it from tests/support/templates/ because the GPU machine has no
llama.cpp tree; this holds the copy to the pinned source (support.llama_cpp), so a pin bump
that changes the template shows up here.
"""

from __future__ import annotations

from support import glm5_chat, llama_cpp


def test_committed_template_is_llama_cpps() -> None:
    header, _, body = glm5_chat.chat_template().partition("\n")
    assert header.startswith("{#-") and header.endswith("-#}"), header[:80]
    assert glm5_chat.LLAMA_CPP_TEMPLATE.removeprefix("models/templates/") in header
    upstream = (llama_cpp.source_dir() / glm5_chat.LLAMA_CPP_TEMPLATE).read_text()
    assert body == upstream
