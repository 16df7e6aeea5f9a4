# cmake -DIN=page.html -DOUT=page.h -DNAME=kSymbol -P embed.cmake
# Writes OUT: the bytes of IN as one C++ raw string constant NAME, so the
# page is part of the binary (no file to install, nothing fetched).
file(READ "${IN}" content)
string(FIND "${content}" ")tandem_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter )tandem_embed\"")
endif()
file(WRITE "${OUT}"
  "// Generated at build time from ${IN} by embed.cmake: do not edit.\n"
  "#pragma once\n\nnamespace tandem {\n\ninline constexpr char ${NAME}[] = R\"tandem_embed(${content})tandem_embed\";\n\n}  // namespace tandem\n")
