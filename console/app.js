// Placeholder: the console is written in the UI branch (issue 15).
