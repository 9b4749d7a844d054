"""Audio output shared by every route: encoding by format, whole (`audio.encode`) or chunk by chunk for
streamed responses (`audio.encode_stream`), and speaking speed (`audio.speed`)."""
