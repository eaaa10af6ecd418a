#!/bin/bash
sort notes.txt > result.txt
