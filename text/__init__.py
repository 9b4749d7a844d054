"""Text preparation shared by every route (books, the speech API, live text, Wyoming): normalization
(`text.normalize`), sentence and clause splitting (`text.split`), inline tags (`text.tags`)."""
