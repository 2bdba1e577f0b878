from transformers import AutoModelForSeq2SeqLM, AutoTokenizer


def test_tiny_model_loads_offline_and_tags_languages(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_dir)
    tok.src_lang = "it"
    ids = tok("il pacchetto per rete").input_ids
    assert ids[0] == tok.convert_tokens_to_ids("__it__") and ids[-1] == tok.eos_token_id
    # language tags are special: they never leak into decoded text
    assert "__" not in tok.decode(ids, skip_special_tokens=True)
    assert model.config.vocab_size == len(tok) + tok.num_madeup_words
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
