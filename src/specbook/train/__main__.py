import sys

if sys.argv[1:2] == ["seq2seq"]:  # python -m specbook.train seq2seq ...: the encoder-decoder pair
    from .seq2seq_cli import main

    main(sys.argv[2:])
else:
    from .cli import main

    main()
