std = "lua54"
max_line_length = 130
files["spec/**/*.lua"] = { std = "+busted" }
exclude_files = { "build/**" }
