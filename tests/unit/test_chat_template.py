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


def _hf_render(source: str, messages, **kwargs) -> str:
    """transformers' own rendering of a template, the behaviour ours follows."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    return tok.apply_chat_template(messages, chat_template=source, tokenize=False, **kwargs)


SYSTEM_FIRST = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\nBe kind."
                "<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHAT = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]


@pytest.mark.parametrize("source", [None, SYSTEM_FIRST], ids=["chatml", "system-first"])
def test_a_final_message_left_open_as_transformers_leaves_it(source):
    tpl = ChatTemplate(source)
    ours = tpl.render(CHAT, add_generation_prompt=False, continue_final_message=True)
    assert ours == _hf_render(tpl.source, CHAT, continue_final_message=True)
    assert ours.endswith("<|im_start|>assistant\nThe colour is")


@pytest.mark.parametrize("source", [None, SYSTEM_FIRST], ids=["chatml", "system-first"])
def test_without_a_generation_prompt_as_transformers(source):
    tpl = ChatTemplate(source)
    ours = tpl.render(CHAT, add_generation_prompt=False)
    assert ours == _hf_render(tpl.source, CHAT, add_generation_prompt=False)
    assert ours.endswith("The colour is<|im_end|>\n")


def test_an_empty_final_message_opens_its_turn():
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]
    out = ChatTemplate(None).render(chat, add_generation_prompt=False, continue_final_message=True)
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_the_final_message_is_found_by_position_not_by_text():
    # The same words earlier in the chat must not be where the cut is made.
    chat = [{"role": "user", "content": "Say: ok"}, {"role": "assistant", "content": "ok"}]
    out = ChatTemplate(None).render(chat, add_generation_prompt=False, continue_final_message=True)
    assert out == "<|im_start|>user\nSay: ok<|im_end|>\n<|im_start|>assistant\nok"


def test_continuing_needs_the_template_to_print_the_message():
    tpl = ChatTemplate("{% for m in messages %}{{ m['role'] }};{% endfor %}")
    with pytest.raises(ChatTemplateError, match="cannot be continued"):
        tpl.render(CHAT, add_generation_prompt=False, continue_final_message=True)
    with pytest.raises(ChatTemplateError, match="exclude each other"):
        ChatTemplate(None).render(CHAT, add_generation_prompt=True, continue_final_message=True)


def test_extra_template_variables_reach_the_template_but_cannot_replace_its_inputs():
    tpl = ChatTemplate("{% if brief %}[brief]{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert tpl.render([{"role": "user", "content": "a"}], variables={"brief": True}) == "[brief]a"
    assert tpl.render([{"role": "user", "content": "a"}]) == "a"
    for name in ("messages", "bos_token", "add_generation_prompt", "raise_exception", "namespace", "range"):
        with pytest.raises(ChatTemplateError, match="set by the renderer"):
            tpl.render([{"role": "user", "content": "a"}], variables={name: "x"})


def test_a_variable_of_the_wrong_type_is_the_callers_error():
    # Python's own TypeError inside the template (as Llama 3's date_string + "..." would raise).
    tpl = ChatTemplate("{{ date_string + ' 2024' }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert tpl.render([{"role": "user", "content": "a"}], variables={"date_string": "1 May"}) == "1 May 2024a"
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        tpl.render([{"role": "user", "content": "a"}], variables={"date_string": 1})
