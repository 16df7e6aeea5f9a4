// Linked into every library target so a folder whose sources are all headers
// still forms a valid static library.
