"""The finance review's web side: who logs in (users, sessions, CSRF), what each role may do
(rights), and the pages people use in a browser."""
