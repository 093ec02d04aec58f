// placeholder until the tokenizer tests land
