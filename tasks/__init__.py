"""Units of work (corpus, training, dump, k-means, maps, translate, evaluate): plain functions over paths and
arrays, plus thin Ray wrappers where a stage fans out."""
