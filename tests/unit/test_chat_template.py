import pytest

from engines.chat_template import ChatTemplate, ChatTemplateError
from engines.errors import ModelLoadError


def test_default_chatml_when_model_has_no_template():
    out = ChatTemplate(None).render([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_template_variables_and_raise_exception():
    src = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
           "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}")
    tpl = ChatTemplate(src, bos_token="<s>", eos_token="</s>")
    assert tpl.render([{"role": "user", "content": "a"}]) == "<s>a</s>"
    with pytest.raises(ChatTemplateError, match="first must be user"):
        tpl.render([{"role": "system", "content": "x"}])


def test_unparseable_template_is_a_load_error():
    with pytest.raises(ModelLoadError, match="does not parse"):
        ChatTemplate("{% for x in %}")
