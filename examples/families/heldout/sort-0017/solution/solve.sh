#!/bin/bash
sort items.txt > total.txt
