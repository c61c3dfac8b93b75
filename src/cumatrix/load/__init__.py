"""Stage one, load: a matrix file (YAML or JSON) checked at file:line:col and expanded into cells."""
