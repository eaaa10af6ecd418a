#!/bin/bash
wc -w < text.txt > words.txt
